"""attnlab.layers.flash_triton: the Triton FlashAttention forward equals SDPA.

On CPU the kernel runs under Triton's interpreter (TRITON_INTERPRET=1, set per test: triton
reads it when the kernel is decorated, which attnlab.layers.flash_triton does on first use, once
per setting); with ATTNLAB_TEST_DEVICE=cuda the same tests compile and run it on the GPU
(scripts/gpu_check.sh, stage flash_triton). Skipped where triton is not installed, except the
checks that need no kernel (input errors; attnlab imports and fails clearly without triton).

* output and log-sum-exp in float32 against float64 SDPA over random shapes (seeded per test;
  the replay line is printed on failure): batch 1-2, 1-2 key/value heads shared by 1-3 query
  heads (GQA), Tq 1-50, Tk up to 80 (rarely a multiple of the block), head sizes 1-40 (the
  kernel pads them to a power of two), no mask / key padding / random / per-head masks with a
  row that may attend to nothing (zeros, L = −∞), causal (bottom-right) or not, blocks 16/32;
* bfloat16 and float16 against float64 SDPA of the same rounded inputs;
* any leading dimensions (2-D, 3-D, 5-D), an explicit scale, strided (transposed) inputs;
* gradients (attnlab.layers.flash's PyTorch recomputation backward fed by the kernel's O, L);
* Triton's GPU compiler (with the ptxas it ships) builds the kernel for sm_80 and sm_90 without
  a GPU: the kernel as the real compiler reads it, which the interpreter does not check.

Interpreted Triton is slow (~10 ms a program here): the shapes are small, ~20 s in all.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from _device import tol
from attnlab.layers.flash_triton import flash_attention_triton

F64 = torch.float64
LOW_PRECISION_TOL = {  # against float64 on the rounded inputs: P is rounded before P V
    torch.bfloat16: tol(torch.bfloat16),
    torch.float16: dict(rtol=5e-3, atol=5e-3),  # 11-bit mantissa: a few steps of 2^-11
}


@pytest.fixture
def kernel_device(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """The device under test, with triton importable and, on CPU, its interpreter on."""
    pytest.importorskip("triton", reason="triton is not installed (setup.sh --test installs it)")
    if device.type == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    return device


def reference(q, k, v, mask, causal, scale=None):
    """float64 SDPA with the mask built from its definition; empty rows -> 0 and L = −∞."""
    q, k, v = (t.to(F64) for t in (q, k, v))
    Tq, Tk = q.shape[-2], k.shape[-2]
    allowed = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed.tril(Tk - Tq)  # bottom-right aligned
    if mask is not None:
        allowed = allowed & mask
    gqa = q.dim() >= 4 and k.shape[-3] != q.shape[-3]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale, enable_gqa=gqa)
    if gqa:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    s = q @ k.transpose(-2, -1) * (scale if scale is not None else q.shape[-1] ** -0.5)
    lse = torch.logsumexp(s.masked_fill(~allowed, -torch.inf), dim=-1)  # (…, Tq)
    out = torch.where(lse[..., None] == -torch.inf, 0.0, out)
    return out, lse


def random_case(generator: torch.Generator, device: torch.device):
    def rint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (), generator=generator))

    B, Hkv, groups = rint(1, 2), rint(1, 2), rint(1, 3)
    H = Hkv * groups
    Tq, Dk, Dv = rint(1, 50), rint(1, 40), rint(1, 40)
    causal = bool(rint(0, 1))
    Tk = Tq + rint(0, 30) if causal else rint(1, 80)
    block_q, block_k = 16 * rint(1, 2), 16 * rint(1, 2)
    mask_kind = ["none", "keys", "random", "per-head"][rint(0, 3)]
    q = torch.randn(B, H, Tq, Dk, generator=generator)
    k = torch.randn(B, Hkv, Tk, Dk, generator=generator)
    v = torch.randn(B, Hkv, Tk, Dv, generator=generator)
    mask = None
    if mask_kind == "keys":
        mask = torch.rand(B, 1, 1, Tk, generator=generator) > 0.3
    elif mask_kind == "random":
        mask = torch.rand(B, 1, Tq, Tk, generator=generator) > 0.5
    elif mask_kind == "per-head":
        mask = torch.rand(B, H, Tq, Tk, generator=generator) > 0.5
        mask[0, 0, rint(0, Tq - 1)] = False  # a row with nothing to attend to
    case = (
        f"B={B} H={H} Hkv={Hkv} Tq={Tq} Tk={Tk} Dk={Dk} Dv={Dv} causal={causal} "
        f"mask={mask_kind} blocks=({block_q},{block_k})"
    )
    tensors = [t.to(device) for t in (q, k, v)] + [None if mask is None else mask.to(device)]
    return (*tensors, causal, block_q, block_k, case)


@pytest.mark.parametrize("draw", range(20))
def test_forward_and_logsumexp_equal_torch_sdpa(draw: int, seed: int, kernel_device) -> None:
    generator = torch.Generator().manual_seed(seed)
    q, k, v, mask, causal, bq, bk, case = random_case(generator, kernel_device)
    got, lse = flash_attention_triton(
        q, k, v, mask, causal, block_q=bq, block_k=bk, return_lse=True
    )
    want, want_lse = reference(q, k, v, mask, causal)
    assert got.dtype == torch.float32 and lse.dtype == torch.float32, case
    torch.testing.assert_close(got, want.float(), **tol(torch.float32), msg=lambda m: case + m)
    assert torch.equal(lse == -torch.inf, want_lse == -torch.inf), case
    finite = want_lse > -torch.inf
    torch.testing.assert_close(lse[finite], want_lse[finite].float(), **tol(torch.float32))
    assert got[~finite].abs().sum() == 0, case  # rows with nothing to attend to: zeros


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_equals_torch_sdpa(dtype: torch.dtype, kernel_device) -> None:
    q = torch.randn(2, 4, 37, 32, device=kernel_device).to(dtype)
    k, v = (torch.randn(2, 2, 45, 32, device=kernel_device).to(dtype) for _ in range(2))
    mask = torch.rand(2, 1, 1, 45, device=kernel_device) > 0.2
    got = flash_attention_triton(q, k, v, mask, True, block_q=16, block_k=32)
    want, _ = reference(q, k, v, mask, True)
    assert got.dtype == dtype
    torch.testing.assert_close(got.to(F64), want, **LOW_PRECISION_TOL[dtype])


@pytest.mark.parametrize("shape", [(21, 8), (2, 19, 16), (2, 3, 2, 23, 8)])
def test_any_leading_dimensions_and_scale(shape, kernel_device) -> None:
    q, k, v = (torch.randn(shape, device=kernel_device) for _ in range(3))
    mask = torch.rand(shape[-2], shape[-2], device=kernel_device) > 0.3  # 2-D: shared by all
    got, lse = flash_attention_triton(q, k, v, mask, True, scale=0.3, return_lse=True)
    want, want_lse = reference(q, k, v, mask, True, scale=0.3)
    assert got.shape == want.shape and lse.shape == shape[:-1]
    torch.testing.assert_close(got, want.float(), **tol(torch.float32))
    torch.testing.assert_close(lse, want_lse.float(), **tol(torch.float32))


def test_strided_inputs(kernel_device) -> None:
    """(B, T, H, D) projections viewed as (B, H, T, D), as a model hands them over."""
    q, k, v = (torch.randn(2, 40, 3, 16, device=kernel_device).transpose(1, 2) for _ in "qkv")
    assert not q.is_contiguous()
    got = flash_attention_triton(q, k, v, is_causal=True, block_q=16, block_k=16)
    want, _ = reference(q, k, v, None, True)
    torch.testing.assert_close(got, want.float(), **tol(torch.float32))


def test_gradients_equal_torch_sdpa(kernel_device) -> None:
    q = torch.randn(2, 4, 29, 16, device=kernel_device, requires_grad=True)
    k, v = (torch.randn(2, 2, 33, 16, device=kernel_device, requires_grad=True) for _ in "kv")
    mask = torch.rand(2, 1, 29, 33, device=kernel_device) > 0.3
    mask[1, 0, 5] = False  # an empty row: zero output, zero gradients
    got = flash_attention_triton(q, k, v, mask, True, block_q=16, block_k=16)
    d_out = torch.randn_like(got)
    grads = torch.autograd.grad(got, (q, k, v), d_out)
    leaves = [t.detach().to(F64).requires_grad_() for t in (q, k, v)]
    want, _ = reference(*leaves, mask, True)
    want_grads = torch.autograd.grad(want, leaves, d_out.to(F64))
    for g, w, name in zip(grads, want_grads, ("dq", "dk", "dv")):
        torch.testing.assert_close(g, w.float(), **tol(torch.float32), msg=lambda m, n=name: n + m)


@pytest.mark.parametrize(
    "arch, dtype, mask, causal, head_dim",
    [(90, torch.bfloat16, True, True, 64), (80, torch.float32, False, False, 128)],
)
def test_compiles_for_nvidia_gpus_without_one(arch, dtype, mask, causal, head_dim, monkeypatch):
    """Triton's whole GPU compiler (its frontend, MLIR passes, LLVM, the ptxas it ships) turns
    the kernel into a cubin for sm_90 (H100/H200) and sm_80 (A100) at the default blocks: what
    the interpreter cannot check (the kernel as Triton's compiler reads it). No GPU needed."""
    triton = pytest.importorskip("triton", reason="triton is not installed")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import attnlab.layers.flash_triton as ft

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    ft._triton()
    if not isinstance(ft.tl.standard._sum_combine, triton.runtime.JITFunction):
        pytest.skip("triton was imported with TRITON_INTERPRET=1: its library is interpreted")
    kernel = triton.jit(ft._flash_fwd)
    consts = ft._constexprs(dtype, head_dim, head_dim, mask, causal, ft.BLOCK_Q, ft.BLOCK_K,
                            allow_tf32=False, interpret=False)  # fmt: skip
    ptr = {torch.float32: "*fp32", torch.bfloat16: "*bf16"}[dtype]
    kinds = dict(Q=ptr, K=ptr, V=ptr, O=ptr, M="*u8" if mask else ptr, L="*fp32", qk_scale="fp32")
    signature = {
        name: "constexpr" if name in consts else kinds.get(name, "i32") for name in kernel.arg_names
    }
    constexprs = {(kernel.arg_names.index(name),): value for name, value in consts.items()}
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": 4, "num_stages": 2},
    )
    assert compiled.asm["cubin"] and ".entry _flash_fwd" in compiled.asm["ptx"]
    assert compiled.metadata.shared <= {80: 163 * 1024, 90: 227 * 1024}[arch]  # fits on chip


def test_refuses_what_it_does_not_take() -> None:
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="float32, bfloat16, float16"):
        flash_attention_triton(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match="power of two >= 16"):
        flash_attention_triton(q, q, q, block_q=24)
    with pytest.raises(ValueError, match="power of two >= 16"):
        flash_attention_triton(q, q, q, block_k=8)
    with pytest.raises(ValueError, match="Tk >= Tq"):
        flash_attention_triton(q, q[:, :, :2], q[:, :, :2], is_causal=True)
    with pytest.raises(ValueError, match="bool"):
        flash_attention_triton(q, q, q, torch.ones(4, 4))
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        flash_attention_triton(torch.randn(1, 3, 4, 8), q.expand(1, 2, 4, 8), q.expand(1, 2, 4, 8))


def test_cpu_tensors_need_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton", reason="triton is not installed")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        flash_attention_triton(q, q, q)


def test_attnlab_imports_without_triton_and_the_kernel_says_what_is_missing() -> None:
    script = (
        "import sys\n"
        "import attnlab, attnlab.layers.flash_triton, attnlab.layers.attention\n"
        "assert 'triton' not in sys.modules, 'importing attnlab imported triton'\n"
        "sys.modules['triton'] = None  # as if it were not installed\n"
        "import torch\n"
        "q = torch.randn(1, 1, 4, 8)\n"
        "try:\n"
        "    attnlab.layers.flash_triton.flash_attention_triton(q, q, q)\n"
        "except RuntimeError as err:\n"
        "    assert 'needs the triton package' in str(err), err\n"
        "else:\n"
        "    raise SystemExit('no error without triton')\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_triton_backend_of_multi_head_attention_equals_the_fused_one(kernel_device) -> None:
    """MultiHeadAttention(backend="triton") in float32: the fused backend's output, and with a
    KV cache the same step-by-step decode; need_weights still gives the explicit weights."""
    from attnlab.layers.attention import MultiHeadAttention

    torch.manual_seed(0)
    fused = MultiHeadAttention(32, 4, 2).to(kernel_device).eval()
    triton = MultiHeadAttention(32, 4, 2, backend="triton").to(kernel_device).eval()
    triton.load_state_dict(fused.state_dict())
    x = torch.randn(2, 9, 32, device=kernel_device)
    with torch.no_grad():
        want, _ = fused(x, is_causal=True)
        got, none = triton(x, is_causal=True)
        assert none is None
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        cache = triton.new_cache()
        steps = [triton(x[:, :5], is_causal=True, cache=cache)[0]]
        steps += [triton(x[:, t : t + 1], is_causal=True, cache=cache)[0] for t in range(5, 9)]
        torch.testing.assert_close(torch.cat(steps, 1), want, rtol=1e-4, atol=1e-5)
        _, weights = triton(x, is_causal=True, need_weights=True)
        assert weights is not None and weights.shape == (2, 4, 9, 9)
