"""Pick the training precision for a device, once, and build its autocast context.

``precision="auto"`` asks the device's capabilities first (:func:`auto_candidate`): a CPU without
native bf16 (neither ``avx512_bf16`` nor ``amx_bf16``) trains in fp32, with no timing. Where a
low precision is available (bf16 on a CPU that has it or whose flags are unknown, or on a GPU
with native bf16; fp16 with a GradScaler on an older GPU) the answer depends on the model: a
fast matmul does not make a small model's step fast (its casts and many small ops can cost more
than the matmuls save). So the engine times the model's own training step both ways
(:func:`time_step_precisions`, CUDA-synchronised on a GPU) and keeps the candidate only if the
step is faster (:func:`choose_by_step_time`), and writes that measurement where the next start
finds it (:mod:`attnlab.train.precision_record`): the same command on the same machine, thread
count and model then reads the choice instead of timing again, so the load of the machine
cannot change it. A resumed run keeps its first choice.

On CUDA the fp32 parts run with TF32 matmuls unless ``precision="fp32"`` is asked for
(:func:`configure_tf32`, through ``torch.backends.cuda.matmul.allow_tf32`` and
``torch.backends.cudnn.allow_tf32``); the run's summary states which.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from attnlab.errors import UserError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
PRECISION_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
MIN_STEP_SPEEDUP = 1.1  # `auto` keeps a low precision that makes the training step this much faster
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str] | None:
    """The flags /proc/cpuinfo lists (x86 ``flags``, Arm ``Features``); None where unknown."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.partition(":")[2].split())
    return flags or None


def cpu_bf16_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> bool | None:
    """Whether the CPU advertises native bf16 (avx512_bf16/amx_bf16); None if flags are unknown."""
    flags = _cpu_flags(cpuinfo)
    return None if flags is None else any(f in flags for f in _CPU_BF16_FLAGS)


def cpu_bf16_flag_names(cpuinfo: str | Path = "/proc/cpuinfo") -> list[str]:
    """The native-bf16 flags the CPU advertises (avx512_bf16, amx_bf16), in that order."""
    flags = _cpu_flags(cpuinfo) or set()
    return [f for f in _CPU_BF16_FLAGS if f in flags]


def cuda_capability(device: str | torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device."""
    return torch.cuda.get_device_capability(torch.device(device))


def cuda_bf16_native(device: str | torch.device) -> bool:
    """Whether the GPU computes bf16 natively (compute capability >= 8.0, Ampere and later).

    ``torch.cuda.is_bf16_supported()`` alone also says True where bf16 is only emulated.
    """
    return cuda_capability(device) >= (8, 0)


def cuda_name(device: str | torch.device) -> str:
    """The GPU's name and compute capability."""
    major, minor = cuda_capability(device)
    name = torch.cuda.get_device_name(torch.device(device))
    return f"{name} (compute capability {major}.{minor})"


@dataclass(frozen=True)
class Candidate:
    """What the device's capabilities say for ``precision="auto"``: the low-precision autocast
    dtype worth timing against fp32 (None: fp32 without timing) and why."""

    dtype: torch.dtype | None
    reason: str


def auto_candidate(device: str | torch.device) -> Candidate:
    """The low precision ``auto`` times against fp32 on ``device``, or None where there is none.

    CPU: bf16 where the CPU advertises native bf16 (``avx512_bf16``/``amx_bf16``) or its flags
    are unknown; none on a CPU without it (bf16 is emulated there). CUDA: bf16 where the GPU has
    it natively, else fp16 (with a GradScaler, see `make_grad_scaler`). Other device types: none.
    """
    kind = torch.device(device).type
    if kind == "cuda":
        if cuda_bf16_native(device):
            return Candidate(torch.bfloat16, f"{cuda_name(device)} has native bf16")
        return Candidate(
            torch.float16, f"{cuda_name(device)} lacks native bf16, so fp16 with a GradScaler"
        )
    if kind == "cpu":
        flags = cpu_bf16_flags()
        if flags is False:
            return Candidate(
                None, "CPU lacks avx512_bf16/amx_bf16, so bf16 matmuls are emulated and slow"
            )
        have = "CPU has native bf16" if flags else "CPU flags unknown"
        return Candidate(torch.bfloat16, have)
    return Candidate(None, f"no low-precision path is tested on device type '{kind}'")


def inference_dtype(device: str | torch.device, requested: str = "auto") -> torch.dtype | None:
    """The autocast dtype for a forward-only pass before the engine has timed ``auto`` (a
    recipe's frozen features): the requested low precision, or for ``auto`` the candidate where
    the device computes it natively (a CPU whose flags are unknown stays in fp32)."""
    if requested == "fp32":
        return None
    if requested != "auto":
        return PRECISION_DTYPES[requested]
    if torch.device(device).type == "cpu" and not cpu_bf16_flags():
        return None
    return auto_candidate(device).dtype


def check_precision(requested: str, device: str | torch.device) -> None:
    """Refuse a precision ``device`` cannot train in, as one line with the fix (a UserError),
    before anything is built or written."""
    if requested not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    kind = torch.device(device).type
    if requested == "fp16" and kind != "cuda":
        low = "bf16" if kind == "cpu" and cpu_bf16_flags() is not False else "fp32"
        raise UserError(
            f"--precision fp16 needs a CUDA GPU (it trains through a GradScaler there); on "
            f"{kind} use --precision {low}, or auto"
        )
    if requested == "bf16" and kind not in ("cpu", "cuda"):
        raise UserError(f"--precision bf16 is only supported on cpu/cuda; use fp32 on {kind}")


def choose_precision(
    device: str | torch.device, requested: str = "auto"
) -> tuple[torch.dtype | None, str]:
    """Return (autocast dtype, or None for plain fp32; one-line reason) for `device`.

    For ``auto`` the dtype is :func:`auto_candidate`'s, which the engine then times against
    fp32 on the model's own step (or reads from an earlier measurement). An explicit bf16 where
    it is emulated still runs but warns; fp16 off CUDA is refused (:func:`check_precision`).
    """
    check_precision(requested, device)
    if requested == "fp32":
        return None, "fp32 requested"
    if requested == "auto":
        cand = auto_candidate(device)
        low = "fp32" if cand.dtype is None else precision_name(cand.dtype)
        return cand.dtype, f"auto -> {low}: {cand.reason}"
    if torch.device(device).type == "cuda" and requested == "bf16" and not cuda_bf16_native(device):
        warnings.warn(
            f"bf16 requested on {cuda_name(device)}, which has no native bf16; it will be "
            "slow (precision='auto' picks fp16 with loss scaling there)",
            stacklevel=2,
        )
    if torch.device(device).type == "cpu" and cpu_bf16_flags() is False:
        warnings.warn(
            "bf16 requested but it is slow here: CPU lacks avx512_bf16/amx_bf16, so bf16 "
            "matmuls are emulated",
            stacklevel=2,
        )
    return PRECISION_DTYPES[requested], f"{requested} requested"


def precision_name(dtype: torch.dtype | None) -> str:
    """'fp32', 'bf16' or 'fp16' for an autocast dtype (None = fp32)."""
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """torch.autocast for `dtype` on `device`, or a no-op context for fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def autocast_off(
    device: torch.device, dtype: torch.dtype | None
) -> contextlib.AbstractContextManager:
    """Autocast switched off inside an :func:`autocast` context for ``dtype`` (a no-op for
    fp32). Nested, it keeps the outer context's cache of cast weights, which autocast drops only
    when its outermost context exits."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, enabled=False)


def make_grad_scaler(
    device: torch.device, dtype: torch.dtype | None
) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16 (its range needs loss scaling); None for fp32/bf16."""
    return torch.amp.GradScaler(device.type) if dtype == torch.float16 else None


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that waits for the device's queued work (CUDA); a no-op on CPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def time_step_precisions(
    run_step: Callable[[torch.dtype | None], None],
    names: tuple[str, ...] = ("fp32", "bf16"),
    *,
    repeats: int = 3,
    sync: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Best-of-`repeats` seconds of `run_step(dtype)` for each precision in `names`,
    interleaved, after one untimed warm-up of each (allocator, kernel caches, autotuning).

    `sync` waits for the device before the clock is read at both ends (CUDA launches are
    asynchronous: without it the clock would time the launches, not the step).

    A low precision whose step raises a RuntimeError (an operation without a kernel for that
    dtype, a dtype mismatch) is not timed: its entry stays ``math.inf``, one line on stderr
    says why, and :func:`choose_by_step_time` then keeps fp32.
    """
    sync = sync or (lambda: None)
    dtypes = {name: PRECISION_DTYPES[name] for name in names}
    best = {name: math.inf for name in dtypes}
    for name, dtype in list(dtypes.items()):
        if dtype is None:
            run_step(dtype)  # fp32 must work: an error there is the model's, not the precision's
            continue
        try:
            run_step(dtype)
        except RuntimeError as err:  # a kernel without this dtype: time it as never finishing
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            print(
                f"[attnlab] precision auto: the training step fails under {name} autocast "
                f"({first[:160]}); falling back to fp32",
                file=sys.stderr,
                flush=True,
            )
            del dtypes[name]
    for _ in range(repeats):
        for name, dtype in dtypes.items():
            sync()
            t0 = time.perf_counter()
            run_step(dtype)
            sync()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def step_timing(seconds: dict[str, float], low: str) -> str:
    """The measured step times as words, e.g. 'fp32 319.9 ms, bf16 166.2 ms: 1.92x'."""
    return (
        f"fp32 {seconds['fp32'] * 1e3:.1f} ms, {low} {seconds[low] * 1e3:.1f} ms: "
        f"{seconds['fp32'] / seconds[low]:.2f}x"
    )


def choose_by_step_time(
    seconds: dict[str, float], why: str, low: str = "bf16"
) -> tuple[torch.dtype | None, str]:
    """auto: the low-precision candidate `low` only if it makes this model's step faster.

    A big matmul can run 2x faster in bf16 while a small model's step runs slower (the casts
    and the many small ops under autocast cost more than the matmuls save; on a GPU a small
    model is bound by kernel launches, not arithmetic), so the decision is made on the step.
    """
    if math.isinf(seconds[low]):
        return None, f"auto -> fp32: {why}, but the training step fails under {low} autocast"
    timing = f"one training step took {step_timing(seconds, low)}"
    if seconds["fp32"] / seconds[low] >= MIN_STEP_SPEEDUP:
        return PRECISION_DTYPES[low], f"auto -> {low}: {why}; {timing}"
    return None, f"auto -> fp32: {why}, but {timing}, not >= {MIN_STEP_SPEEDUP}x"


def configure_tf32(device: torch.device, requested: str) -> str:
    """Set TF32 for the fp32 matmuls (and cuDNN convolutions) of a CUDA run; say what was set.

    On: ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` =
    True, where the GPU has TF32 (compute capability >= 8.0) and ``precision`` is not an
    explicit ``fp32`` (which means IEEE fp32). The caller restores the flags afterwards
    (:func:`tf32_flags`). A CPU has no TF32: nothing is set.
    """
    if device.type != "cuda":
        return "TF32: not applicable on CPU (fp32 matmuls are IEEE fp32)"
    has_tf32 = cuda_capability(device) >= (8, 0)
    on = has_tf32 and requested != "fp32"
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    if requested == "fp32":
        why = "precision='fp32' asks for IEEE fp32"
    elif has_tf32:
        why = "the GPU has TF32"
    else:
        why = "the GPU has no TF32 (compute capability < 8.0)"
    return (
        f"TF32 {'on' if on else 'off'} for fp32 matmuls and convolutions ({why}; set with "
        f"torch.backends.cuda.matmul.allow_tf32={on}, torch.backends.cudnn.allow_tf32={on})"
    )


def tf32_flags() -> tuple[bool, bool]:
    """The current (matmul, cuDNN) TF32 flags, to restore after :func:`configure_tf32`."""
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def restore_tf32(flags: tuple[bool, bool]) -> None:
    """Put back the flags :func:`tf32_flags` returned."""
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
