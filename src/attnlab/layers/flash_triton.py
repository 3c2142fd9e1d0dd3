"""FlashAttention's forward as a Triton kernel: the algorithm of :mod:`attnlab.layers.flash` (the
FlashAttention-2 forward, Dao 2023, Algorithm 1) in one GPU program per query block.

One program owns ``block_q`` query rows of one (batch, head). It loads its query tile once, then
walks the key/value blocks of ``block_k`` rows, keeping per row a running maximum m, a running
sum ℓ and an unnormalised output O in float32 registers:

    S   = Q_i K_jᵀ · scale · log₂e                 (block_q, block_k), masked entries −∞
    m'  = max(m, rowmax(S))
    P   = 2^(S − m'),   α = 2^(m − m')             α: the one rescale of this block
    ℓ'  = α ℓ + rowsum(P),   O' = α O + P V_j

(base 2 instead of e: the same identity with the factor log₂e folded into the scale, as the
hardware's exp2 is the cheap one). After the last block it writes O / ℓ and the log-sum-exp
L = (m + log₂ ℓ) · ln 2 of every row; a row with nothing to attend to keeps ℓ = 0 and is
written as zeros with L = −∞ (the documented rule of :mod:`attnlab.layers.flash`). Under
``is_causal`` the loop stops at the last key block that reaches the diagonal. Why one rescale
per block is exact: docs/inference.md.

Conventions are those of :func:`attnlab.layers.flash.flash_attention`: q, k, v of shape (…, T, d)
with any leading dimensions (the third from the end is the head dimension with four or more;
k, v may have fewer heads: grouped-query attention, as if each key/value head were repeated:
the kernel reads key/value head h // (H / Hkv) instead of copying), a boolean ``mask`` where
True means *may attend* read by :func:`attnlab.layers.shapes.normalize_mask`, ``is_causal``
aligned bottom-right, ``scale`` (default 1/√d), block sizes as arguments (powers of two >= 16,
as ``tl.dot`` needs; T need not be a multiple). Inputs float32, bfloat16 or float16; the
matmuls accumulate in float32, and float32 inputs are multiplied in IEEE float32 (not TF32)
unless ``allow_tf32=True``.

The forward is the Triton kernel. The backward is :mod:`attnlab.layers.flash`'s recomputation
backward in PyTorch tensor operations (it needs only q, k, v, O and L, all of which the kernel
leaves), so gradients are exact but not fast.

Triton is optional and imported only when the function is called: ``import attnlab`` never
needs it. The kernel runs on CUDA tensors, or on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, read at each call; the kernel is decorated once per setting), which is
how the tests prove it on a machine without a GPU (tests/layers/test_flash_triton.py). One
difference there: Triton 3.9's interpreter multiplies bfloat16 tiles as their raw 16-bit integers,
so under the interpreter bfloat16 tiles are widened to float32 before ``tl.dot`` (the same products:
a bfloat16 product is exact in float32). Its speed on a GPU is measured by
``scripts/gpu_check.sh`` (stage ``flash_triton``, ``benchmarks/flash_triton.py``).
Models reach it as the ``"triton"`` backend of
:func:`attnlab.layers.attention.scaled_dot_product_attention` (``backend = "triton"`` in a model
config; CUDA only).
"""

from __future__ import annotations

import math
import types
from typing import Any

import torch
from torch import Tensor

from attnlab.layers.shapes import as_4d, check_mask, check_qkv

BLOCK_Q = 64
BLOCK_K = 64
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
LOG2E = 1.4426950408889634

_KERNELS: dict[bool, Any] = {}  # interpreted? -> the kernel, decorated on first use
tl: Any = None  # triton.language, set by _triton() (the kernel's body reads it as a global)


def _triton() -> types.ModuleType:
    """The triton module, or a RuntimeError saying how to install it."""
    global tl
    try:
        import triton
        import triton.language
    except ImportError as err:
        raise RuntimeError(
            "flash_attention_triton needs the triton package (Linux): pip install "
            "triton==3.7.1, the version torch 2.13's CUDA wheels bring (bash scripts/setup.sh "
            "--test installs it); "
            f"importing it failed: {err}"
        ) from err
    tl = triton.language
    return triton


def _interpreting(triton: types.ModuleType) -> bool:
    """Whether Triton's interpreter is on (TRITON_INTERPRET=1, or set through triton.knobs)."""
    return bool(triton.knobs.runtime.interpret)


def _kernel(triton: types.ModuleType, interpret: bool) -> Any:
    """The forward kernel, decorated with triton.jit under the current interpreter setting
    (triton reads it when a function is decorated, so each setting gets its own)."""
    if interpret not in _KERNELS:
        _KERNELS[interpret] = triton.jit(_flash_fwd)
    return _KERNELS[interpret]


def flash_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
    return_lse: bool = False,
    allow_tf32: bool = False,
    num_warps: int = 4,
    num_stages: int = 2,
) -> Tensor | tuple[Tensor, Tensor]:
    """softmax(Q Kᵀ · scale, masked) V by the Triton kernel (module docstring); (…, Tq, Dv).

    Arguments as :func:`attnlab.layers.flash.flash_attention`. ``return_lse``: also return the
    log-sum-exp of every row, float32 of shape (…, Tq) (−∞ for a row with nothing to attend
    to). ``allow_tf32``: let float32 matmuls use TF32 on GPUs that have it (faster, ~1e-3
    relative). ``num_warps``/``num_stages``: Triton launch settings. Differentiable in q, k, v
    (backward by recomputation in PyTorch, :mod:`attnlab.layers.flash`). Raises ValueError on inputs
    it does not take, RuntimeError without triton, or for CPU tensors outside the interpreter.
    """
    check_qkv(q, k, v, is_causal)
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if b < 16 or b & (b - 1):
            raise ValueError(f"{name} must be a power of two >= 16 (tl.dot tiles), got {b}")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(
            "the Triton kernel takes q, k, v of one dtype among float32, bfloat16, float16; got "
            f"{q.dtype}, {k.dtype}, {v.dtype} (attnlab.layers.flash.flash_attention takes float64)"
        )
    n, Tk = q.dim(), k.shape[-2]
    if mask is not None:
        mask = check_mask(mask, (*q.shape[:-1], Tk))
    q4, k4, v4 = (as_4d(t, n) for t in (q, k, v))  # (N, H, T, D), views where possible
    mask4 = None if mask is None else as_4d(mask, n, q.shape[:-3])  # (N|1, H|1, Tq|1, Tk|1)
    H, Hkv = q4.shape[1], k4.shape[1]
    if H % Hkv != 0 or v4.shape[1] != Hkv:
        raise ValueError(
            f"query heads ({H}) must be a multiple of key/value heads (k: {Hkv}, v: {v4.shape[1]})"
        )
    devices = {t.device for t in (q, k, v, *(() if mask is None else (mask,)))}
    if len(devices) != 1:
        raise ValueError(f"q, k, v and mask must be on one device, got {sorted(map(str, devices))}")
    triton = _triton()
    interpret = _interpreting(triton)
    device = q.device
    if device.type != "cuda" and not (device.type == "cpu" and interpret):
        raise RuntimeError(
            f"the Triton kernel runs on CUDA tensors; got {device} tensors. On the CPU it runs "
            "only under Triton's interpreter: set TRITON_INTERPRET=1 before the first call (slow: "
            "for testing). attnlab.layers.flash.flash_attention is the PyTorch version for any "
            "device"
        )
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    settings = (is_causal, scale, block_q, block_k, allow_tf32, num_warps, num_stages, interpret)
    out, lse = _FlashTriton.apply(q4, k4, v4, mask4, _kernel(triton, interpret), settings)
    out = out.reshape(*q.shape[:-1], v.shape[-1])  # (…, Tq, Dv)
    if return_lse:
        return out, lse.reshape(q.shape[:-1])  # (…, Tq)
    return out


def _launch(
    kernel: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, settings: tuple
) -> tuple[Tensor, Tensor]:
    """Run the kernel on (N, H, Tq, Dk), (N, Hkv, Tk, Dk), (N, Hkv, Tk, Dv) -> O, L."""
    causal, scale, block_q, block_k, allow_tf32, num_warps, num_stages, interpret = settings
    N, H, Tq, Dk = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    out = torch.empty(N, H, Tq, Dv, dtype=q.dtype, device=q.device)  # (N, H, Tq, Dv)
    lse = torch.empty(N, H, Tq, dtype=torch.float32, device=q.device)  # (N, H, Tq)
    if out.numel() == 0:
        return out.zero_(), lse.fill_(-math.inf)
    if mask is None:
        m, m_strides = q, (0, 0, 0, 0)  # never read (HAS_MASK is False)
    else:
        m = mask.expand(N, H, Tq, Tk).view(torch.uint8)  # broadcast dimensions: stride 0
        m_strides = m.stride()
    grid = (N * H, -(-Tq // block_q))  # (sample × head, query block)
    kernel[grid](
        q, k, v, m, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *m_strides, *out.stride(), *lse.stride(),
        H, H // Hkv, Tq, Tk, Dk, Dv, scale * LOG2E,
        **_constexprs(q.dtype, Dk, Dv, mask is not None, causal, block_q, block_k, allow_tf32,
                      interpret),
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out, lse


def _constexprs(
    dtype: torch.dtype,
    Dk: int,
    Dv: int,
    has_mask: bool,
    causal: bool,
    block_q: int,
    block_k: int,
    allow_tf32: bool,
    interpret: bool,
) -> dict[str, Any]:
    """The kernel's compile-time arguments (one compiled kernel per distinct set)."""
    return dict(
        HAS_MASK=has_mask,
        CAUSAL=causal,
        PRECISION="ieee" if dtype == torch.float32 and not allow_tf32 else "tf32",  # 16-bit: moot
        BLOCK_M=block_q,
        BLOCK_N=block_k,
        BLOCK_DK=max(16, 1 << (Dk - 1).bit_length()),  # head sizes padded to a power of two
        BLOCK_DV=max(16, 1 << (Dv - 1).bit_length()),
        DOT_F32=interpret and dtype == torch.bfloat16,
    )


class _FlashTriton(torch.autograd.Function):
    """Forward: the Triton kernel. Backward: attnlab.layers.flash's recomputation from q, k, v,
    O, L."""

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, kernel: Any, settings: tuple
    ) -> tuple[Tensor, Tensor]:
        out, lse = _launch(kernel, q, k, v, mask, settings)
        ctx.save_for_backward(q, k, v, out, lse, *(() if mask is None else (mask,)))
        ctx.settings = (mask is not None, *settings)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, d_out: Tensor, _d_lse: Tensor | None) -> tuple[Tensor | None, ...]:
        from attnlab.layers.flash import _Flash

        has_mask, causal, scale, block_q, block_k, *_ = ctx.settings
        q, k, v, out, lse, *rest = ctx.saved_tensors
        H, Hkv = q.shape[1], k.shape[1]
        group = H // Hkv
        if group > 1:  # the PyTorch backward takes repeated key/value heads; sum back after
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        saved = (q, k, v, out, lse.to(q.dtype), *rest)
        tiled = types.SimpleNamespace(
            saved_tensors=saved, settings=(has_mask, causal, scale, block_q, block_k)
        )
        dq, dk, dv, *_ = _Flash.backward(tiled, d_out.contiguous())
        if group > 1:
            N, _, Tk, _ = dk.shape
            dk = dk.view(N, Hkv, group, Tk, -1).sum(2)  # (N, Hkv, Tk, Dk)
            dv = dv.view(N, Hkv, group, Tk, -1).sum(2)  # (N, Hkv, Tk, Dv)
        return dq, dk, dv, None, None, None


# --------------------------------------------------------------------------- the kernel
# A plain function, decorated by _kernel() when first used; `tl` is triton.language by then.
# Annotations stay strings (`from __future__ import annotations`), which is how triton reads
# them ("constexpr" in the annotation). The body calls only triton's builtins: its library
# functions (tl.max, tl.sum, tl.zeros) are themselves @triton.jit functions, decorated in the
# mode that was on when triton was first imported (interpreted or compiled), and calling one of
# the other mode fails; torch._dynamo imports triton early, so that mode is not ours to choose.
# The row max and sum are tl.reduce with triton's own combine functions instead (exactly what
# tl.max/tl.sum do on float32; the interpreter recognises them and reduces with numpy).


def _flash_fwd(
    Q, K, V, M, O, L,  # pointers: q, k, v, the uint8 mask (or any pointer), output, log-sum-exp
    sqn, sqh, sqm, sqd,
    skn, skh, skm, skd,
    svn, svh, svm, svd,
    smn, smh, smm, smk,
    son, soh, som, sod,
    sln, slh, slm,
    H, GROUP, Tq, Tk, DK, DV,
    qk_scale,  # scale · log2(e)
    HAS_MASK: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    DOT_F32: tl.constexpr,  # multiply bfloat16 tiles as float32 (the interpreter's workaround)
):  # fmt: skip
    pid_nh = tl.program_id(0)  # which (sample, head)
    pid_m = tl.program_id(1)  # which query block
    n = (pid_nh // H).to(tl.int64)
    h = (pid_nh % H).to(tl.int64)
    hk = h // GROUP  # the key/value head this query head reads (grouped-query attention)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query positions
    cols0 = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    dk = tl.arange(0, BLOCK_DK)
    dv = tl.arange(0, BLOCK_DV)
    row_ok = rows < Tq

    q_ptrs = Q + n * sqn + h * sqh + rows[:, None] * sqm + dk[None, :] * sqd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (dk[None, :] < DK), other=0.0)  # (BM, BDK)
    if DOT_F32:
        q = q.to(tl.float32)
    k_base = K + n * skn + hk * skh
    v_base = V + n * svn + hk * svh
    m_base = M + n * smn + h * smh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max (base-2 units)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)  # running sum
    acc = tl.full([BLOCK_M, BLOCK_DV], 0.0, tl.float32)  # running unnormalised output
    offset = Tk - Tq  # bottom-right alignment: query i sits at key position i + offset
    hi = Tk
    if CAUSAL:  # key blocks wholly above the diagonal contribute nothing: stop before them
        hi = tl.minimum(Tk, (pid_m + 1) * BLOCK_M + offset)
    for start in range(0, hi, BLOCK_N):
        cols = start + cols0
        col_ok = cols < Tk
        kt = tl.load(
            k_base + cols[None, :] * skm + dk[:, None] * skd,
            mask=col_ok[None, :] & (dk[:, None] < DK),
            other=0.0,
        )  # (BDK, BN): K_jᵀ
        if DOT_F32:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale  # (BM, BN) float32
        keep = col_ok[None, :] & row_ok[:, None]
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + offset)
        if HAS_MASK:
            allowed = tl.load(
                m_base + rows[:, None] * smm + cols[None, :] * smk, mask=keep, other=0
            )
            keep = keep & (allowed != 0)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.reduce(s, 1, tl.standard._elementwise_max))  # (BM,)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet
        p = tl.exp2(s - m_use[:, None])  # (BM, BN); masked -> 0
        alpha = tl.exp2(m_i - m_use)  # (BM,) the one rescale of this block
        l_i = l_i * alpha + tl.reduce(p, 1, tl.standard._sum_combine)
        vj = tl.load(
            v_base + cols[:, None] * svm + dv[None, :] * svd,
            mask=col_ok[:, None] & (dv[None, :] < DV),
            other=0.0,
        )  # (BN, BDV)
        if DOT_F32:
            vj = vj.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(vj.dtype), vj, input_precision=PRECISION)
        m_i = m_new

    seen = l_i > 0.0  # rows with at least one key they may attend to
    l_safe = tl.where(seen, l_i, 1.0)
    out = tl.where(seen[:, None], acc / l_safe[:, None], 0.0)
    lse = tl.where(seen, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    o_ptrs = O + n * son + h * soh + rows[:, None] * som + dv[None, :] * sod
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & (dv[None, :] < DV))
    tl.store(L + n * sln + h * slh + rows * slm, lse, mask=row_ok)
