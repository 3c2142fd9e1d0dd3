"""Peak resident memory and resident memory over the steps of `attnlab train TASK`, per task.

Each run is a fresh `python -m attnlab train TASK --max-steps N --num-threads 1` in a child
process. The peak is the child's high-water mark (``ru_maxrss`` from ``wait4``, what
``/usr/bin/time -v`` reports as "Maximum resident set size"); the curve is the child's VmRSS,
read from /proc every 0.2 s, against the last step written to its metrics.jsonl.
``--before SRC`` also runs classify from another source tree (e.g. the code before a fix,
``git archive COMMIT src | tar -x -C DIR``, then ``--before DIR/src``) at the same time, so both
see the same machine load.

    python -m benchmarks.engine.peak_memory --before /tmp/before/src
        -> docs/results/peak_memory.{json,md}
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import common

ROOT = common.ROOT
# task -> (steps, extra arguments): short runs, all started at once (a shared 2-core machine)
CASES = {
    "classify": (120, []),
    "lm": (10, []),
    "vision": (5, []),
    "translate": (3, []),
}


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _last_step(metrics: Path) -> int:
    step = 0
    try:
        for line in metrics.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError, ValueError):  # a half-written line
                step = max(step, int(json.loads(line).get("step", 0)))
    except OSError:
        pass
    return step


class Run:
    """One `attnlab train` child, watched from a thread."""

    def __init__(self, label: str, task: str, steps: int, extra: list[str], src: Path) -> None:
        self.label, self.task, self.steps = label, task, steps
        self.dir = Path(tempfile.mkdtemp(prefix=f"peak_{task}_"))
        self.argv = ["train", task, "--out", str(self.dir / "run"), "--max-steps", str(steps)]
        self.argv += ["--num-threads", "1", "--tensorboard", "false", "--log-every", "10", *extra]
        env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
        self.start = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "attnlab", *self.argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "stderr.txt", "w"),  # noqa: SIM115 (closed with the process)
        )
        self.end: float | None = None  # when the watcher saw the child exit
        self.curve: dict[int, float] = {}  # step -> highest RSS seen while it was the last step
        self.first_rss = 0.0
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        metrics = self.dir / "run" / "metrics.jsonl"
        # waitid with WNOWAIT looks without reaping: wait4 must reap, to read the child's peak
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        while True:
            try:
                if os.waitid(os.P_PID, self.proc.pid, flags) is not None:
                    self.end = time.perf_counter()
                    return
            except ChildProcessError:  # wait4 reaped it meanwhile
                self.end = time.perf_counter()
                return
            rss = _rss_mb(self.proc.pid)
            step = _last_step(metrics)
            if rss is not None:
                if step == 0:
                    self.first_rss = max(self.first_rss, rss)
                else:
                    self.curve[step] = max(self.curve.get(step, 0.0), rss)
            time.sleep(0.2)

    def wait(self) -> dict:
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.thread.join()
        wall = (self.end or time.perf_counter()) - self.start  # the child's own, not the wait's
        error, precision = None, "auto"
        with contextlib.suppress(OSError, json.JSONDecodeError, IndexError):
            lines = (self.dir / "run" / "metrics.jsonl").read_text().splitlines()
            precision = json.loads(lines[-1]).get("precision", precision)
        if self.proc.returncode != 0:
            error = (self.dir / "stderr.txt").read_text().strip().splitlines()[-1:]
        return {
            "label": self.label,
            "task": self.task,
            "command": "attnlab " + " ".join(a for a in self.argv if not a.startswith("/")),
            "returncode": self.proc.returncode,
            "precision": precision,
            "error": error,
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux: kilobytes
            "rss_before_first_log_mb": round(self.first_rss, 1),
            "rss_by_step_mb": {str(k): round(v, 1) for k, v in sorted(self.curve.items())},
            "wall_s": round(wall, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        }


def _curve_cells(row: dict, steps: list[int]) -> list[str]:
    curve = {int(k): v for k, v in row["rss_by_step_mb"].items()}
    cells = []
    for s in steps:
        seen = [v for k, v in curve.items() if k <= s]
        cells.append(f"{seen[-1]:.0f}" if seen else "")
    return cells


FINDINGS = """\
What held the memory of `attnlab train classify` (found with short runs, RSS read per step):

- **One tensor shape per batch length.** Batches were padded to their longest row, so a run met
  a new (batch, length) shape for nearly every length up to max_len, in training and in
  evaluation. Under bf16 autocast on a CPU the matmuls run through oneDNN, which builds and
  caches a kernel (a "primitive") per shape: the cache, not tensors, grew all through training
  (with `ONEDNN_PRIMITIVE_CACHE_CAPACITY=0` the growth stopped). Fix: batches are padded to a
  multiple of 16 tokens, at most the data's longest row (`data/buckets.py`, `bucket_length`),
  so a run meets a dozen widths; the extra padding is masked and leaves logits unchanged
  (tests/data/test_classification_data.py checks both).
- **The allocator keeps freed activation blocks.** glibc raises its mmap threshold as large
  blocks are freed, so later activations come from the heap, which only shrinks from its top;
  `malloc_trim` gave a large share of the resident memory back. Pinning the threshold
  (`MALLOC_MMAP_THRESHOLD_`) brought resident memory near the live set but made training steps
  markedly slower (every step faults its activations in again), so it is not used. With a
  fixed set of shapes the freed blocks are reused and the heap stops growing.
- **Not the cause:** the number of live tensors stayed constant over training (no metrics,
  history or autograd graph kept alive); the n-gram features hash by arithmetic (no tables);
  the precision probe times one step per precision; TensorBoard was off in these runs.
- **Attention dropout (fixed since).** PyTorch's fused CPU attention kernel
  (`_scaled_dot_product_flash_attention_for_cpu`) refuses dropout, so with `attn_dropout = 0.1`
  every attention call took the math path, which materialises the scores, the softmax, the
  dropout mask and the dropped weights, (batch, heads, T, T) each, and keeps most of them for
  the backward pass: 315 MiB allocated per call's forward and backward against 48 MiB for the
  fused kernel, for a batch of 64 reviews of 192 characters (docs/results/sdpa_dropout_memory.md,
  `python -m benchmarks.attention.sdpa_dropout_memory`). The preset now has
  `attn_dropout = 0` (three seeds: the same in-domain and out-of-domain accuracy within noise,
  docs/classify.md), so the fused kernel runs.
- **Evaluation batches of 256.** Validation and test ran 256 texts per batch (no gradients, but
  a 256 × 192 × 512 feed-forward activation is 100 MB by itself); `eval_batch_size` now defaults
  to 64.
- **Gradient checkpointing (the preset now).** Each block's activations are recomputed in the
  backward pass instead of kept (dropout masks replayed, so the numbers are the same: a test in
  tests/layers/test_blocks.py compares outputs and gradients). The last run of this page compares
  the tree with `gradient_checkpointing = true` ("this tree") against the same tree with it false
  (`--before`, a copy of src/ with the preset line flipped), side by side.
- **What remains:** the imported libraries, the parameters, gradients and AdamW
  moments (the n-gram bag alone is 65,536 × 128: 134 MB with its gradient and moments), one
  training step's activations, and what glibc keeps of freed blocks (see above).
"""


def write_report(rows: list[dict], meta: dict, out: Path) -> None:
    meta = common.upgrade_machine(meta)
    out.mkdir(parents=True, exist_ok=True)
    (out / "peak_memory.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    lines = [
        "# Peak resident memory of `attnlab train` (`benchmarks/engine/peak_memory.py`)",
        "",
        f"{meta['cpu']}, {meta['logical_cores']} logical cores, one torch thread; load average "
        f"{meta['load_average_at_start'][0]:.1f} at start, "
        f"{meta['load_average_at_end'][0]:.1f} at end "
        "(other jobs shared the machine; memory does not depend on speed). Peak = the child's "
        "high-water mark (ru_maxrss, as `/usr/bin/time -v`); the curve is its resident memory "
        "(VmRSS) when the given step was the last one logged. MB = MiB.",
        "",
        "| run | task | precision | steps | peak RSS MB | RSS at first log | wall s | CPU s "
        "| note |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        first = next(iter(r["rss_by_step_mb"].values()), "")
        note = "; ".join(r["error"]) if r["error"] else ""
        steps = max((int(k) for k in r["rss_by_step_mb"]), default=0)
        lines.append(
            f"| {r['label']} | {r['task']} | {r.get('precision', 'auto')} | {steps} | "
            f"{r['peak_rss_mb']:.0f} | {first} | "
            f"{r['wall_s']:.0f} | {r.get('cpu_s', float('nan')):.0f} | {note} |"
        )
    classify = [r for r in rows if r["task"] == "classify"]
    if classify:
        top = max(int(k) for r in classify for k in r["rss_by_step_mb"]) if classify else 0
        logged = sorted({int(k) for r in classify for k in r["rss_by_step_mb"]})
        fixed = [s for s in (10, 50, 100, 200, 300, 400, 500, 600, 800, 1000) if s <= top]
        marks = logged if len(logged) <= 10 else fixed
        lines += [
            "",
            "Resident memory (MB) of classify over training steps (an epoch is about 487 "
            "steps of 64 texts with the preset's HowNet words, 218 without):",
            "",
            "| run | " + " | ".join(f"step {s}" for s in marks) + " |",
            "|---|" + "---:|" * len(marks),
        ]
        for r in classify:
            lines.append(f"| {r['label']} | " + " | ".join(_curve_cells(r, marks)) + " |")
    lines += ["", FINDINGS]
    common.write_page(out / "peak_memory.md", lines, meta["command"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(CASES), help="comma-separated tasks")
    parser.add_argument("--steps", type=int, default=0, help="override every task's step count")
    parser.add_argument("--before", default="", help="another src/ tree to run classify from")
    parser.add_argument(
        "--precision",
        default="auto",
        help="passed to every run; auto times fp32 against bf16, a noisy choice under load",
    )
    parser.add_argument("--out", default=str(ROOT / "docs" / "results"))
    parser.add_argument("--report-only", action="store_true", help="rewrite the md from the json")
    args = parser.parse_args(argv)
    if args.report_only:
        saved = json.loads((Path(args.out) / "peak_memory.json").read_text())
        write_report(saved["rows"], saved["meta"], Path(args.out))
        return

    info = common.machine(threads=1)
    runs = []
    for task in args.tasks.split(","):
        steps, extra = CASES[task]
        steps, extra = args.steps or steps, [*extra, "--precision", args.precision]
        runs.append(Run(f"{task} (this tree)", task, steps, extra, ROOT / "src"))
        if args.before and task == "classify":
            runs.append(Run(f"{task} (before)", task, steps, extra, Path(args.before)))
    rows = [run.wait() for run in runs]  # all at once: each sees the same load
    print(json.dumps({r["label"]: r["peak_rss_mb"] for r in rows}), flush=True)
    meta = {
        **info,
        "command": "python -m benchmarks.engine.peak_memory " + " ".join(sys.argv[1:]),
        "load_average_at_end": common.load_average(),
    }
    write_report(rows, meta, Path(args.out))


if __name__ == "__main__":
    main()
