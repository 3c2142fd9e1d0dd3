"""Inference checks: the hand-written FlashAttention against ``F.scaled_dot_product_attention``
(float64; outputs and the three input gradients; random shapes, masks, causal or not, GQA,
block sizes that do not divide T); speculative decoding against the target's own greedy
decoding (token for token); int8 weights against ``torch.ao.quantization``'s per-channel
quantiser and the dequantised matmul against its bound.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlab.verify.check import Measure

F64 = torch.float64


def flash_case(m: Measure, generator: torch.Generator | None = None) -> str:
    """One random case of flash vs F.scaled_dot_product_attention; returns its description."""

    def rint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (), generator=generator))

    from attnlab.layers.flash import flash_attention

    B, Hkv, groups = rint(1, 3), rint(1, 3), rint(1, 3)
    H = Hkv * groups
    Tq, Dk, Dv = rint(1, 70), rint(1, 16), rint(1, 16)
    causal = bool(rint(0, 1))
    Tk = Tq + rint(0, 20) if causal else rint(1, 70)
    block_q, block_k = rint(1, 40), rint(1, 40)
    mask_kind = ["none", "keys", "random", "per-head"][rint(0, 3)]

    def leaf(*shape: int) -> Tensor:
        return torch.randn(*shape, dtype=F64, generator=generator).requires_grad_()

    q, k, v = leaf(B, H, Tq, Dk), leaf(B, Hkv, Tk, Dk), leaf(B, Hkv, Tk, Dv)
    mask = None
    if mask_kind == "keys":
        mask = torch.rand(B, 1, 1, Tk, generator=generator) > 0.3
    elif mask_kind == "random":
        mask = torch.rand(B, 1, Tq, Tk, generator=generator) > 0.5
    elif mask_kind == "per-head":
        mask = torch.rand(B, H, Tq, Tk, generator=generator) > 0.5
        mask[0, 0, 0] = False  # a row with nothing to attend to
    ref_mask = mask
    if causal:  # the oracle's mask, bottom-right aligned, built from its definition
        lower = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
        ref_mask = lower if mask is None else mask & lower
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=ref_mask, enable_gqa=Hkv != H)
    got = flash_attention(q, k, v, mask, causal, block_q=block_q, block_k=block_k)
    m.diff(got, want, "output")
    d_out = torch.randn(want.shape, dtype=F64, generator=generator)
    for g, w, name in zip(
        torch.autograd.grad(got, (q, k, v), d_out),
        torch.autograd.grad(want, (q, k, v), d_out),
        ("dq", "dk", "dv"),
    ):
        m.diff(g, w, name)
    m.case()
    return (
        f"B={B} H={H} Hkv={Hkv} Tq={Tq} Tk={Tk} Dk={Dk} Dv={Dv} causal={causal} "
        f"mask={mask_kind} blocks=({block_q},{block_k})"
    )


def check_flash(m: Measure, cases: int = 12) -> None:
    for _ in range(cases):
        flash_case(m)


# --------------------------------------------------------------------------- speculative


def plain_greedy(model, prompt: Tensor, n: int) -> list[int]:
    """The target's own greedy decoding: Generation (KV cache, window), one token per step."""
    from attnlab.infer.generation import Generation

    gen = Generation(model.eval(), prompt)
    with torch.no_grad():
        for _ in range(n):
            gen.append(gen.next_logits().argmax(dim=-1))  # (1,)
    return gen.ids[0, prompt.shape[1] :].tolist()


def speculative_greedy_case(m: Measure, generator: torch.Generator | None = None) -> str:
    """Random target and draft GPTs (float64), random prompt, length and K: speculative
    greedy output (draft model, and prompt lookup) vs the target's own greedy output."""
    from attnlab.infer.speculative import ModelDrafter, NgramDrafter, speculative_decode
    from attnlab.models.gpt import GPT, GPTConfig

    def rint(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (), generator=generator))

    V, context = rint(3, 30), rint(8, 48)

    def model(layers: int, ctx: int) -> Any:
        torch.manual_seed(rint(0, 2**30))
        cfg = GPTConfig(vocab_size=V, context=ctx, n_layers=layers, n_heads=2, d_model=8)
        net = GPT(cfg).double().eval()
        with torch.no_grad():
            for p in net.parameters():
                p.mul_(6.0)  # peaked distributions, so drafts are sometimes right, sometimes not
        return net

    target, draft = model(rint(1, 3), context), model(1, rint(4, 48))
    prompt = torch.randint(0, V, (1, rint(1, context + 5)), generator=generator)
    n, k = rint(1, 40), rint(1, 8)
    want = plain_greedy(target, prompt, n)
    for drafter in (ModelDrafter(draft), NgramDrafter(rint(1, 3))):
        got, _ = speculative_decode(target, prompt, n, drafter, k)
        if got != want:
            m.fail(f"{type(drafter).__name__} V={V} ctx={context} T={prompt.shape[1]} n={n} k={k}")
        m.case()
    return f"V={V} context={context} prompt={prompt.shape[1]} n={n} k={k}"


def check_speculative(m: Measure, cases: int = 6) -> None:
    for _ in range(cases):
        speculative_greedy_case(m)


# --------------------------------------------------------------------------- int8


def ao_per_channel(w: Tensor) -> tuple[Tensor, Tensor]:
    """torch.ao.quantization's symmetric per-channel qint8 weights of w (out, in): the int8
    values and the scales (float32)."""
    from torch.ao.quantization import PerChannelMinMaxObserver

    observer = PerChannelMinMaxObserver(
        ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric
    )
    observer(w)
    scale, zero_point = observer.calculate_qparams()
    q = torch.quantize_per_channel(w, scale.float(), zero_point, 0, torch.qint8)
    return q.int_repr(), scale.float()


def check_int8(m: Measure, cases: int = 6) -> None:
    """Int8 weights equal torch.ao's; the dequantised matmul stays within its bound (the
    error reported is how far past the bound, 0 when within)."""
    from attnlab.compress.int8 import (
        Int8Linear,
        dynamic_bound,
        quantize_per_channel,
        weight_only_bound,
    )

    for _ in range(cases):
        inp, out = (int(t) for t in torch.randint(1, 200, (2,)))
        linear = torch.nn.Linear(inp, out)
        q, scale = quantize_per_channel(linear.weight)
        q_ao, scale_ao = ao_per_channel(linear.weight.detach())
        if not torch.equal(q, q_ao):
            m.fail("int8 weights differ from torch.ao's")
        m.diff(scale, scale_ao, "scales")
        x = torch.randn(int(torch.randint(1, 9, ())), inp)
        with torch.no_grad():
            ref = linear(x)
            for acts, bound in (("none", weight_only_bound), ("dynamic", dynamic_bound)):
                layer = Int8Linear.from_linear(linear, acts)
                excess = (layer(x) - ref).abs() - bound(x, layer) - 1e-5 * (1 + ref.abs())
                m.value(max(0.0, float(excess.max())))
        m.case()
