"""The device the device-aware tests run on, and each dtype's tolerance: stated once, here.

    python -m pytest tests/layers/test_attention.py                           # CPU (the default)
    ATTNLAB_TEST_DEVICE=cuda python -m pytest tests/layers/test_attention.py  # the same on CUDA

A device-aware module opts in with ``pytestmark = pytest.mark.usefixtures("on_test_device")``
(tests/conftest.py): each of its tests then runs with that device as torch's default device,
so every tensor and module it builds lands there without naming it. A test that needs the
device explicitly takes the ``device`` fixture. On CPU nothing changes at all. A test
whose kernel does not exist on a device skips with the reason (tests/layers/test_fused_backends.py).
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE_ENV = "ATTNLAB_TEST_DEVICE"


def selected_device() -> torch.device:
    """The device named by ATTNLAB_TEST_DEVICE (default cpu); UsageError if it cannot be used."""
    name = os.environ.get(DEVICE_ENV, "").strip() or "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise pytest.UsageError(f"{DEVICE_ENV}={name!r} is not a device; use cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise pytest.UsageError(f"{DEVICE_ENV}={name!r}: the tests run on cpu or cuda only")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise pytest.UsageError(
                f"{DEVICE_ENV}={name}, but torch {torch.__version__} sees no CUDA device; "
                "install the CUDA build of torch (scripts/gpu_check.sh does) or unset it"
            )
        # deterministic cuBLAS (tests compare runs bitwise); read when cuBLAS starts, so now
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return device


DEVICE = selected_device()
ON_CUDA = DEVICE.type == "cuda"

# Tolerances of comparisons against a reference computed another way (same maths, other
# order or kernel), by the dtype of the tensors compared. float64 compares tightly; float32
# allows kernel-to-kernel differences (fused vs explicit, CUDA vs CPU reductions); bfloat16 has
# an 8-bit mantissa (a relative step of 2^-8 = 0.4%) and allows a few steps.
TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float64: dict(rtol=1e-7, atol=1e-9),
    torch.float32: dict(rtol=1e-4, atol=1e-5),
    torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
}


def tol(dtype: torch.dtype) -> dict[str, float]:
    """``rtol``/``atol`` for ``torch.testing.assert_close`` on tensors of ``dtype``."""
    if dtype not in TOLERANCES:
        raise ValueError(
            f"no tolerance stated for {dtype}; add it to TOLERANCES in tests/_device.py"
        )
    return TOLERANCES[dtype]


def rng_state() -> tuple[torch.Tensor, torch.Tensor | None]:
    """The RNG states random ops on the test device draw from (CPU, and CUDA when testing it)."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(DEVICE) if ON_CUDA else None


def set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    """Restore what :func:`rng_state` returned."""
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, DEVICE)
