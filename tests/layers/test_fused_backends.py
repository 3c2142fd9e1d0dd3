"""The fused path of scaled_dot_product_attention, pinned to one kernel, == the explicit path.

``torch.nn.attention.sdpa_kernel`` allows exactly one backend (flash attention or the
memory-efficient kernel), so a kernel that cannot take the inputs raises instead of falling
back to the math kernel unseen. Outputs and the gradients of q, k, v are compared with the
explicit (step-by-step) path run in float64 on the same rounded inputs, fp32 and bf16, for no
mask, causal and key-padding masks, with per-dtype tolerances (tests/_device.py), norm-wise:
max |error| <= atol + rtol * max |reference|.

On CUDA (ATTNLAB_TEST_DEVICE=cuda) these are the GPU kernels. On CPU torch has a flash
kernel too (fp32, bf16, masks), so the flash cases run here as well; the memory-efficient
kernel exists on CUDA only.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from _device import tol
from attnlab.layers.attention import scaled_dot_product_attention

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def unsupported(backend: str, dtype: torch.dtype, case: str, device: torch.device) -> str | None:
    """Why this kernel cannot take these inputs on this device (documented limits), or None."""
    if device.type == "cpu":
        if backend == "efficient":
            return "the memory-efficient kernel is CUDA only (run with ATTNLAB_TEST_DEVICE=cuda)"
        return None
    if backend == "flash" and dtype == torch.float32:
        return "CUDA flash attention takes fp16/bf16 inputs only"
    if backend == "flash" and case == "padding":
        return "CUDA flash attention takes no attn_mask (causal only)"
    return None


def assert_close_normwise(got: Tensor, want: Tensor, dtype: torch.dtype, what: str) -> None:
    t = tol(dtype)
    err = (got.double() - want).abs().max().item()
    bound = t["atol"] + t["rtol"] * want.abs().max().item()
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g} ({dtype})"


@pytest.mark.parametrize("case", ["plain", "causal", "padding"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_fused_kernel_equals_explicit_path(
    device: torch.device, backend: str, dtype_name: str, case: str
) -> None:
    dtype = DTYPES[dtype_name]
    reason = unsupported(backend, dtype, case, device)
    if reason is not None:
        pytest.skip(reason)
    B, H, T, D = 2, 4, 96, 64
    q, k, v = (torch.randn(B, H, T, D, device=device).to(dtype).requires_grad_() for _ in range(3))
    cot = torch.randn(B, H, T, D, device=device)
    mask = None
    if case == "padding":
        lengths = torch.tensor([T, T // 3], device=device)
        mask = (torch.arange(T, device=device) < lengths[:, None])[:, None, None, :]  # (B,1,1,T)
    causal = case == "causal"

    with sdpa_kernel(BACKENDS[backend]):  # this kernel only: no silent fallback
        out, _ = scaled_dot_product_attention(q, k, v, mask, is_causal=causal, backend="fused")
    assert out.dtype == dtype and out.shape == (B, H, T, D)
    grads = torch.autograd.grad((out.float() * cot).sum(), (q, k, v))

    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want, _ = scaled_dot_product_attention(*ref, mask, is_causal=causal, backend="explicit")
    want_grads = torch.autograd.grad((want * cot.double()).sum(), ref)

    assert_close_normwise(out, want, dtype, f"{backend} {case} output")
    for name, got, expected in zip("qkv", grads, want_grads):
        assert_close_normwise(got, expected, dtype, f"{backend} {case} d{name}")
