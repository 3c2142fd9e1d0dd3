"""Pick the training precision for a device by measurement, and build its autocast context.

``precision="auto"`` works the same way on every device: detection names the one
low-precision candidate (CPU: bf16 where the CPU has native bf16 and a timed matmul confirms
it; CUDA: bf16 where the GPU supports it natively, else fp16 with a GradScaler), then the
engine times the model's own training step in fp32 and under the candidate's autocast
(:func:`time_step_precisions`, CUDA-synchronised on a GPU) and keeps the candidate only if the
step is faster (:func:`choose_by_step_time`). A resumed run keeps its first choice.

On CUDA the fp32 parts run with TF32 matmuls unless ``precision="fp32"`` is asked for
(:func:`configure_tf32`, through ``torch.backends.cuda.matmul.allow_tf32`` and
``torch.backends.cudnn.allow_tf32``); the run's summary states which.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
PRECISION_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
MIN_BF16_SPEEDUP = 1.25  # bf16 must beat fp32 matmuls by this factor for `auto` to pick it
MIN_STEP_SPEEDUP = 1.1  # ... and then the model's own training step by this factor
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> bool | None:
    """Whether the CPU advertises native bf16 (avx512_bf16/amx_bf16); None if flags are unknown."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    flags = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.partition(":")[2].split())
    if not flags:
        return None
    return any(f in flags for f in _CPU_BF16_FLAGS)


@functools.lru_cache(maxsize=1)
def bf16_matmul_speedup(size: int = 512, repeats: int = 5) -> float:
    """Measured fp32 time / bf16 time of a size x size CPU matmul (best of `repeats`; cached)."""
    best = {torch.float32: float("inf"), torch.bfloat16: float("inf")}
    gen = torch.Generator().manual_seed(0)  # a private generator: the global RNG is untouched
    mats = {
        dt: (
            torch.randn(size, size, generator=gen).to(dt),
            torch.randn(size, size, generator=gen).to(dt),
        )
        for dt in best
    }
    for a, b in mats.values():  # warm-up: first calls pay for kernel selection
        a @ b
    for _ in range(repeats):
        for dt, (a, b) in mats.items():  # interleaved so background load hits both alike
            start = time.perf_counter()
            a @ b
            best[dt] = min(best[dt], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


def _cpu_bf16_is_fast() -> tuple[bool, str]:
    """Whether bf16 autocast pays off on this CPU, with the evidence as a sentence."""
    flags = cpu_bf16_flags()
    if flags is False:
        return False, "CPU lacks avx512_bf16/amx_bf16, so bf16 matmuls are emulated and slow"
    speedup = bf16_matmul_speedup()
    source = "CPU has native bf16 flags" if flags else "CPU flags unknown"
    fast = speedup >= MIN_BF16_SPEEDUP
    verdict = "faster" if fast else f"not >= {MIN_BF16_SPEEDUP}x faster"
    return fast, f"{source}; measured bf16 matmul {speedup:.2f}x vs fp32 ({verdict})"


def cuda_capability(device: str | torch.device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA device."""
    return torch.cuda.get_device_capability(torch.device(device))


def cuda_bf16_native(device: str | torch.device) -> bool:
    """Whether the GPU computes bf16 natively (compute capability >= 8.0, Ampere and later).

    ``torch.cuda.is_bf16_supported()`` alone also says True where bf16 is only emulated.
    """
    return cuda_capability(device) >= (8, 0)


def _cuda_name(device: str | torch.device) -> str:
    major, minor = cuda_capability(device)
    name = torch.cuda.get_device_name(torch.device(device))
    return f"{name} (compute capability {major}.{minor})"


def choose_precision(
    device: str | torch.device, requested: str = "auto"
) -> tuple[torch.dtype | None, str]:
    """Return (autocast dtype, or None for plain fp32; one-line reason) for `device`.

    For ``auto`` the dtype is the candidate that the engine then times against fp32 on the
    model's own step (module docstring). CUDA: bf16 where the GPU has it natively, else fp16
    (it needs a GradScaler, see `make_grad_scaler`). CPU: bf16 only if the CPU has native bf16
    and a timed matmul confirms it is faster; otherwise fp32. An explicit bf16 where it is slow
    still runs but warns; fp16 on CPU is refused.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {requested!r}")
    kind = torch.device(device).type
    if requested == "fp32":
        return None, "fp32 requested"
    if kind == "cuda":
        bf16_ok = cuda_bf16_native(device)
        if requested == "auto":
            if bf16_ok:
                return torch.bfloat16, f"auto -> bf16: {_cuda_name(device)} has native bf16"
            return torch.float16, (
                f"auto -> fp16: {_cuda_name(device)} lacks native bf16, so fp16 with a GradScaler"
            )
        if requested == "bf16" and not bf16_ok:
            warnings.warn(
                f"bf16 requested on {_cuda_name(device)}, which has no native bf16; it will be "
                "slow (precision='auto' picks fp16 with loss scaling there)",
                stacklevel=2,
            )
        dtype = torch.bfloat16 if requested == "bf16" else torch.float16
        return dtype, f"{requested} requested"
    if kind == "cpu":
        if requested == "fp16":
            raise ValueError("precision='fp16' needs CUDA; on CPU use precision='bf16' or 'fp32'")
        fast, why = _cpu_bf16_is_fast()
        if requested == "auto":
            return (
                (torch.bfloat16, f"auto -> bf16: {why}") if fast else (None, f"auto -> fp32: {why}")
            )
        if not fast:
            warnings.warn(f"bf16 requested but it is slow here: {why}", stacklevel=2)
        return torch.bfloat16, f"bf16 requested ({why})"
    if requested == "auto":
        return None, f"auto -> fp32: no low-precision path is tested on device type '{kind}'"
    raise ValueError(f"precision={requested!r} is only supported on cpu/cuda; use 'fp32' on {kind}")


def precision_name(dtype: torch.dtype | None) -> str:
    """'fp32', 'bf16' or 'fp16' for an autocast dtype (None = fp32)."""
    return {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """torch.autocast for `dtype` on `device`, or a no-op context for fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


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
    speedup = seconds["fp32"] / seconds[low]
    timing = (
        f"one training step took {seconds['fp32'] * 1e3:.1f} ms in fp32 and "
        f"{seconds[low] * 1e3:.1f} ms under {low} autocast ({speedup:.2f}x)"
    )
    if speedup >= MIN_STEP_SPEEDUP:
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
