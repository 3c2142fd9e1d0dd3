#!/usr/bin/env bash
# Check and measure attnlab on one CUDA GPU in under ten minutes; every result lands in OUTDIR.
#
#   bash scripts/gpu_check.sh OUTDIR            on a machine with an NVIDIA GPU (~9.5 min at most)
#   bash scripts/gpu_check.sh --dry-run OUTDIR  every stage on the CPU at toy sizes (CI runs it)
#
# Stages, in order, each time-boxed with `timeout` (limits below, in seconds); a stage that
# fails or runs out of time is recorded (exit code, last lines of its log) and the next one
# still runs; one global deadline keeps the whole script inside BUDGET_S:
#   install    what is missing: `bash scripts/setup.sh --test` if attnlab's test dependencies
#              are not importable; then, if torch.cuda.is_available() is false with the CPU
#              wheel (torch==2.13.0+cpu), the CUDA build of the SAME pinned version from PyPI's
#              default index, where the Linux x86_64 torch wheels are CUDA builds that bring
#              their nvidia-* libraries as dependencies:
#                pip download --isolated --index-url https://pypi.org/simple torch==2.13.0 -d DIR
#                pip install --isolated --no-index --find-links DIR --force-reinstall torch==2.13.0
#              (--isolated ignores pip.conf, whose extra indexes may prefer the +cpu wheel;
#              downloading first leaves the working CPU torch in place if the network fails;
#              never unpinned). Needs network and ~3 GB of downloads.
#   env        nvidia-smi, torch and CUDA versions, GPU name, compute capability, bf16, TF32
#              flags, the SDPA kernels enabled, what precision=auto would try  -> env.json/.md
#   tests      ATTNLAB_TEST_DEVICE=cuda pytest on the device-aware files (and every run verb
#              on the device, tests/tasks/test_run_device.py)  -> tests/junit.xml
#   bench_*    `attnlab bench --device cuda --only SECTION`, one stage per section (kernels,
#              MHA vs nn.MultiheadAttention, encoder layer, GPT step vs HF GPT-2 with memory,
#              decoding, scaling to long sequences)  -> bench/SECTION.{json,md}
#   classify   the default classifier run, `attnlab train classify --device cuda
#              --max-minutes 1`  -> runs/classify/
#   lm         the larger LM preset, `attnlab train lm --config small --device cuda
#              --batch-size 64 --max-minutes 1.25` (nanoGPT's Shakespeare model with its GPU
#              batch)  -> runs/lm/
#   flash_triton  the Triton FlashAttention forward (attnlab.layers.flash_triton): its tests compiled
#              and run on the GPU (ATTNLAB_TEST_DEVICE=cuda pytest tests/layers/test_flash_triton.py),
#              then benchmarks/attention/flash_triton.py, its forward time and peak memory beside SDPA
#              and attnlab.layers.flash at T = 1k..8k, bf16  -> tests/flash_triton.xml,
#              bench/flash_triton.{json,md}. Last, so it never squeezes the stages above: it
#              gets what is left of the budget (skipped, and recorded so, if that is < 15 s).
# Then summary.md and summary.json: every stage's status, exit code, duration and limit.
# Per-stage logs in logs/, per-stage results in results/STAGE.json.
#
# --dry-run runs the same machinery on the CPU at toy sizes: the install stage only checks
# (and prints the commands above), a small test subset, `attnlab bench --quick` on the kernels
# and MHA sections, classify/lm runs of a few steps on tiny models, and flash_triton's tests and
# `--quick` benchmark under Triton's interpreter (CPU; without triton installed the tests skip
# and the benchmark says so). Exit status: 0 when every stage is ok, 1 otherwise.
set -uo pipefail

DRY=0
if [ "${1:-}" = "--dry-run" ]; then
  DRY=1
  shift
fi
if [ $# -ne 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: bash scripts/gpu_check.sh [--dry-run] OUTDIR" >&2
  exit 2
fi
REPO="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$1" || exit 2
OUT="$(cd "$1" && pwd)"
mkdir -p "$OUT/logs" "$OUT/results" "$OUT/bench" "$OUT/runs" "$OUT/tests"
: > "$OUT/stages.txt"
REPORT=(python3 "$REPO/scripts/gpu_check_report.py")
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's attnlab
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
cd "$REPO" || exit 2

TORCH_VERSION="2.13.0"
KILL_GRACE_S=10  # after a stage's limit: SIGTERM, then SIGKILL this much later
MIN_STAGE_S=15   # a stage is skipped when less than this is left of the budget
if [ "$DRY" = 1 ]; then
  MODE="dry run (CPU, toy sizes)"
  DEVICE=cpu
  # generous: the toy stages take ~1 minute on an idle 2-core machine, but the test suite runs
  # this beside other jobs, and at load 6 a stage took over 120 s (a red test by chance)
  BUDGET_S=1800
  BENCH_SECTIONS="kernels mha"
  declare -A LIMIT=([env]=120 [install]=120 [tests]=300 [bench_kernels]=240 [bench_mha]=240
    [classify]=300 [lm]=300 [flash_triton]=300)
else
  MODE="CUDA"
  DEVICE=cuda
  BUDGET_S=570  # 9.5 minutes: the limits below add up to more only when install is needed
  BENCH_SECTIONS="kernels mha encoder_layer gpt_step generation scaling"
  # without install: 555 s; scaling starts a fresh process (CUDA context) per point
  declare -A LIMIT=([env]=20 [install]=150 [tests]=90 [bench_kernels]=20 [bench_mha]=20
    [bench_encoder_layer]=15 [bench_gpt_step]=40 [bench_generation]=40 [bench_scaling]=100
    [classify]=90 [lm]=120 [flash_triton]=90)
fi
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))

# run_stage NAME EXPECTED_FILES NOTE -- COMMAND...: time-box COMMAND, log it, record the result
run_stage() {
  local name=$1 expect=$2 note=$3
  shift 4
  echo "$name" >> "$OUT/stages.txt"
  local left=$((DEADLINE - $(date +%s) - KILL_GRACE_S))
  local limit=${LIMIT[$name]}
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt "$MIN_STAGE_S" ]; then
    echo "skipped: ${left}s left of the ${BUDGET_S}s budget" > "$OUT/logs/$name.log"
    "${REPORT[@]}" stage "$OUT" "$name" -1 0 "$limit" "$expect" "budget spent" -- "$@"
    return
  fi
  echo "[gpu_check] $name (limit ${limit}s): $*"
  local t0 rc
  t0=$(date +%s%N)
  timeout --kill-after="$KILL_GRACE_S" "$limit" "$@" > "$OUT/logs/$name.log" 2>&1
  rc=$?
  "${REPORT[@]}" stage "$OUT" "$name" "$rc" $((($(date +%s%N) - t0) / 1000000)) "$limit" \
    "$expect" "$note" -- "$@"
}

# ---------------------------------------------------------------- install (a function, timed)
install_what_is_missing() {
  local need="import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in \
('attnlab', 'pytest', 'hypothesis', 'transformers', 'safetensors', 'torch')))"
  if ! python3 -c "$need"; then
    if [ "$DRY" = 1 ]; then
      echo "dry run: would run bash scripts/setup.sh --test"
    else
      bash "$REPO/scripts/setup.sh" --test || return 1
    fi
  fi
  local has_cuda
  has_cuda=$(python3 -c "import torch; print('torch', torch.__version__, 'CUDA build', \
torch.version.cuda, 'sees CUDA:', torch.cuda.is_available())") || return 1
  echo "$has_cuda"
  if [ "${has_cuda##* }" = True ]; then
    echo "torch sees CUDA: nothing to install"
    return 0
  fi
  local dir="${TMPDIR:-/tmp}/attnlab-torch-cuda"
  local get=(python3 -m pip download --isolated --index-url https://pypi.org/simple
    "torch==$TORCH_VERSION" -d "$dir")
  local put=(python3 -m pip install --isolated --no-index --find-links "$dir" --force-reinstall
    "torch==$TORCH_VERSION")
  if [ "$DRY" = 1 ]; then
    echo "dry run: torch sees no CUDA (expected on CPU); on a GPU machine this stage runs:"
    echo "  ${get[*]}"
    echo "  ${put[*]}"
    return 0
  fi
  if ! command -v nvidia-smi > /dev/null && [ ! -e /dev/nvidia0 ]; then
    echo "no NVIDIA GPU visible (no nvidia-smi, no /dev/nvidia0): not downloading CUDA torch"
    return 1
  fi
  "${get[@]}" || return 1
  "${put[@]}" || return 1
  python3 -c "import torch, sys; print('now', torch.__version__, torch.version.cuda); \
sys.exit(0 if torch.cuda.is_available() else 3)"
}
export -f install_what_is_missing
export DRY REPO TORCH_VERSION

# ---------------------------------------------------------------- stages
run_stage install "" "$([ "$DRY" = 1 ] && echo 'dry run: checks only')" -- \
  bash -c install_what_is_missing

run_stage env "env.json,env.md" "" -- "${REPORT[@]}" env "$OUT" "$DEVICE"

if [ "$DRY" = 1 ]; then
  TEST_FILES=(tests/layers/test_fused_backends.py
    "tests/train/test_checkpoint.py::test_checkpoint_moves_between_devices_bitwise"
    "tests/train/test_precision.py::test_step_timing_synchronises_around_every_timed_step"
    tests/tasks/test_run_device.py)
else
  TEST_FILES=(tests/layers/test_fused_backends.py tests/layers/test_attention.py tests/layers/test_blocks.py
    tests/layers/test_efficient.py tests/models/test_gpt.py tests/verify/test_hf_parity.py tests/train/test_engine.py
    tests/train/test_checkpoint.py tests/train/test_precision.py tests/tasks/test_run_device.py)
fi
run_stage tests "tests/junit.xml" "ATTNLAB_TEST_DEVICE=$DEVICE" -- \
  env ATTNLAB_TEST_DEVICE="$DEVICE" python3 -m pytest -q -p no:cacheprovider -rs \
  --junitxml "$OUT/tests/junit.xml" "${TEST_FILES[@]}"

for section in $BENCH_SECTIONS; do
  flags=(--device "$DEVICE" --only "$section" --out "$OUT/bench/$section.md")
  [ "$DRY" = 1 ] && flags+=(--quick --num-threads 1)
  run_stage "bench_$section" "bench/$section.json,bench/$section.md" "" -- \
    python3 -m attnlab bench "${flags[@]}"
done

if [ "$DRY" = 1 ]; then
  CLASSIFY=(--arch char --max-steps 3 --eval-every 3 --d-model 16 --n-heads 2 --n-layers 1 --d-ff 32
    --ngram-buckets 64 --num-threads 1 --tensorboard false)
  LM=(--config quick --max-steps 4 --eval-every 4 --checkpoint-every 4)
else
  CLASSIFY=(--max-minutes 1)
  LM=(--config small --batch-size 64 --max-minutes 1.25)
fi
run_stage classify "runs/classify/results.json" "" -- \
  python3 -m attnlab train classify --out "$OUT/runs/classify" --device "$DEVICE" "${CLASSIFY[@]}"
run_stage lm "runs/lm/results.json" "" -- \
  python3 -m attnlab train lm --out "$OUT/runs/lm" --device "$DEVICE" "${LM[@]}"

# flash_triton: the kernel's tests on the device (CPU: Triton's interpreter, set by the tests),
# then its benchmark; the stage fails if either does.
flash_triton_stage() {
  local rc=0 bench=(--device "$DEVICE")
  [ "$DRY" = 1 ] && bench=(--quick)
  env ATTNLAB_TEST_DEVICE="$DEVICE" python3 -m pytest -q -p no:cacheprovider -rs \
    --junitxml "$OUT/tests/flash_triton.xml" tests/layers/test_flash_triton.py || rc=1
  python3 -m benchmarks.attention.flash_triton "${bench[@]}" --out "$OUT/bench/flash_triton" || rc=1
  return $rc
}
export -f flash_triton_stage
export OUT DEVICE
run_stage flash_triton "tests/flash_triton.xml,bench/flash_triton.json,bench/flash_triton.md" \
  "$([ "$DRY" = 1 ] && echo 'dry run: Triton interpreter on CPU, toy sizes')" -- \
  bash -c flash_triton_stage

echo
"${REPORT[@]}" summary "$OUT" "$MODE" "$BUDGET_S"
