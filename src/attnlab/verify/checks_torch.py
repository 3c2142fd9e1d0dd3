"""Parity checks against PyTorch's own modules, on random configurations in float64.

* ``scaled_dot_product_attention`` (fused and explicit paths) vs ``F.scaled_dot_product_attention``
  with the mask built from definitions (padding by length, bottom-right causal from
  ``torch.nn.attention.bias.causal_lower_right``, random masks, additive bias, GQA);
* ``MultiHeadAttention`` vs ``nn.MultiheadAttention`` (self, cross, kdim≠d_model; key padding
  and attention masks; averaged weights);
* ``Block`` / ``DecoderBlock`` vs ``nn.TransformerEncoderLayer`` / ``DecoderLayer``
  (post- and pre-norm, relu/gelu, padding and causal masks);
* ``BlockStack`` + ``Decoder`` stacks vs ``nn.Transformer``.
Outputs, input gradients and every parameter gradient are compared.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.bias import causal_lower_right

from attnlab.layers.attention import (
    MultiHeadAttention,
    combine_masks,
    from_attn_mask,
    from_key_padding_mask,
    scaled_dot_product_attention,
)
from attnlab.layers.blocks import Block, BlockConfig, BlockStack, Decoder, DecoderBlock
from attnlab.verify.check import Measure
from attnlab.verify.copy_weights import (
    copy_links,
    decoder_layer_links,
    encoder_layer_links,
    max_grad_error,
    mha_links,
    transformer_links,
)

F64 = torch.float64


def randint(lo: int, hi: int) -> int:
    """Uniform integer in [lo, hi] from torch's seeded generator."""
    return int(torch.randint(lo, hi + 1, ()))


def choice(options: list):
    return options[randint(0, len(options) - 1)]


def leaf(*shape: int) -> Tensor:
    return torch.randn(*shape, dtype=F64, requires_grad=True)


def twin(*shape: int) -> tuple[Tensor, Tensor]:
    """Two leaves holding the same values (one per side)."""
    x = torch.randn(*shape, dtype=F64)
    return x.clone().requires_grad_(), x.clone().requires_grad_()


def right_padding(B: int, T: int) -> Tensor:
    """PyTorch key_padding_mask (True = pad) with random lengths 1..T, row 0 unpadded."""
    lengths = torch.randint(1, T + 1, (B,))
    lengths[0] = T
    return torch.arange(T)[None, :] >= lengths[:, None]


def square_causal(T: int) -> Tensor:
    return torch.ones(T, T, dtype=torch.bool).triu(1)  # True = blocked


def compare_grads(m: Measure, pairs: list[tuple[Tensor, Tensor]]) -> None:
    for ours, theirs in pairs:
        if ours.grad is None or theirs.grad is None:
            m.fail("an input got no gradient")
        else:
            m.diff(ours.grad, theirs.grad, "input gradient")


# --------------------------------------------------------------------------- SDPA


def check_sdpa(m: Measure, cases: int = 24) -> None:
    for _ in range(cases):
        hkv = choice([1, 2])
        B, H, Tq = randint(1, 3), hkv * choice([1, 2, 3]), randint(1, 7)
        Tk, Dk, Dv = randint(Tq, 9), randint(1, 8), randint(1, 8)
        kind = choice(["none", "padding", "causal", "padding+causal", "random"])
        q, k, v = leaf(B, H, Tq, Dk), leaf(B, hkv, Tk, Dk), leaf(B, hkv, Tk, Dv)
        bias = leaf(1, H, Tq, Tk) if choice([False, True]) else None
        scale = choice([None, float(torch.rand(())) + 0.1])
        full = torch.ones(B, H, Tq, Tk, dtype=torch.bool)  # the reference mask, by definition
        mask = None
        if "padding" in kind:  # lengths >= 1: key 0 is always visible, no row is empty
            keep = torch.arange(Tk)[None, :] < torch.randint(1, Tk + 1, (B,))[:, None]
            full = full & keep[:, None, None, :]
            mask = keep[:, None, None, :]
        if "causal" in kind:
            full = full & causal_lower_right(Tq, Tk)._materialize()
        if kind == "random":
            mask = torch.rand(choice([1, B]), choice([1, H]), Tq, Tk) < 0.7
            mask[..., 0] = True
            full = full & mask
        rep = H // hkv
        attn_mask = full if bias is None else bias.masked_fill(~full, float("-inf"))
        want = F.scaled_dot_product_attention(
            q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask, scale=scale
        )
        leaves = [t for t in (q, k, v, bias) if t is not None]
        cot = torch.randn_like(want)
        want_grads = torch.autograd.grad((want * cot).sum(), leaves)
        for backend in ("explicit", "fused", "matmul", "flash"):  # triton: CUDA, not float64
            got, _ = scaled_dot_product_attention(
                q, k, v, mask, is_causal="causal" in kind, bias=bias, scale=scale, backend=backend
            )
            m.diff(got, want)
            for g, w in zip(torch.autograd.grad((got * cot).sum(), leaves), want_grads):
                m.diff(g, w, "gradient")
        m.case()


# --------------------------------------------------------------------------- MHA


def check_mha(m: Measure, cases: int = 12) -> None:
    for _ in range(cases):
        kind = choice(["self", "cross", "cross_kdim"])
        B, H, head, Tq = randint(1, 3), choice([1, 2, 4]), randint(1, 5), randint(1, 6)
        d = H * head
        Tk = Tq if kind == "self" else randint(1, 6)
        kdim = d + randint(1, 5) if kind == "cross_kdim" else None
        bias = choice([True, False])
        theirs = nn.MultiheadAttention(
            d, H, batch_first=True, dtype=F64, bias=bias, kdim=kdim, vdim=kdim
        )
        ours = MultiHeadAttention(d, H, kdim=kdim, vdim=kdim, bias=bias).double()
        links = mha_links(ours, theirs)
        copy_links(links)
        kpm = right_padding(B, Tk) if choice([False, True]) else None
        attn_mask = None
        if choice([False, True]):
            attn_mask = torch.rand(B * H, Tq, Tk) < 0.4
            attn_mask[..., 0] = False  # key 0 stays visible
            if kpm is not None:
                kpm[:, 0] = False
        mask = combine_masks(
            None if kpm is None else from_key_padding_mask(kpm),
            None if attn_mask is None else from_attn_mask(attn_mask, n_heads=H),
        )
        x_ours, x_theirs = twin(B, Tq, d)
        ctx = None if kind == "self" else twin(B, Tk, kdim or d)
        src = x_theirs if ctx is None else ctx[1]
        average = choice([False, True])
        want, want_w = theirs(
            x_theirs,
            src,
            src,
            key_padding_mask=kpm,
            attn_mask=attn_mask,
            average_attn_weights=average,
        )
        got, got_w = ours(
            x_ours,
            None if ctx is None else ctx[0],
            mask=mask,
            need_weights=True,
            average_weights=average,
        )
        m.diff(got, want)
        m.diff(got_w, want_w, "attention weights")
        cot = torch.randn_like(want)
        (got * cot).sum().backward()
        (want * cot).sum().backward()
        compare_grads(m, [(x_ours, x_theirs)] + ([] if ctx is None else [ctx]))
        m.value(max_grad_error(links))
        m.case()


# --------------------------------------------------------------------------- layers and stacks


def _block(d: int, H: int, ff: int, norm_first: bool, **kw) -> BlockConfig:
    """attnlab's block config for PyTorch's layer keywords (norm_first -> norm_position)."""
    return BlockConfig(d, H, ff, norm_position="pre" if norm_first else "post", **kw)


def encoder_layer_case(
    m: Measure, d: int, H: int, ff: int, B: int, T: int, *, norm_first: bool, activation: str,
    bias: bool, padding: bool, causal: bool,
) -> None:  # fmt: skip
    """One Block == nn.TransformerEncoderLayer comparison: output and every gradient."""
    kw = dict(dropout=0.0, activation=activation, norm_first=norm_first, bias=bias)
    theirs = nn.TransformerEncoderLayer(d, H, ff, batch_first=True, dtype=F64, **kw)
    ours = Block(_block(d, H, ff, **kw)).double()
    links = encoder_layer_links(ours, theirs)
    copy_links(links)
    kpm = right_padding(B, T) if padding else None
    x_ours, x_theirs = twin(B, T, d)
    want = theirs(
        x_theirs,
        src_mask=square_causal(T) if causal else None,
        src_key_padding_mask=kpm,
        is_causal=causal,
    )
    mask = None if kpm is None else from_key_padding_mask(kpm)
    got, _ = ours(x_ours, mask, is_causal=causal)
    _backward_and_compare(m, got, want, [(x_ours, x_theirs)], links)


def check_encoder_layer(m: Measure, cases: int = 8) -> None:
    for _ in range(cases):
        H = choice([1, 2, 4])
        d, ff, B, T = H * randint(2, 5), randint(4, 24), randint(1, 3), randint(1, 7)
        encoder_layer_case(
            m, d, H, ff, B, T, norm_first=choice([False, True]),
            activation=choice(["relu", "gelu"]), bias=choice([False, True]),
            padding=choice([False, True]), causal=choice([False, True]),
        )  # fmt: skip


def decoder_layer_case(
    m: Measure, d: int, H: int, ff: int, B: int, Tq: int, Tk: int, *, norm_first: bool,
    activation: str, padding: bool, memory_padding: bool, causal: bool,
) -> None:  # fmt: skip
    """One DecoderBlock == nn.TransformerDecoderLayer comparison: output and every gradient."""
    kw = dict(dropout=0.0, activation=activation, norm_first=norm_first)
    theirs = nn.TransformerDecoderLayer(d, H, ff, batch_first=True, dtype=F64, **kw)
    ours = DecoderBlock(_block(d, H, ff, **kw)).double()
    links = decoder_layer_links(ours, theirs)
    copy_links(links)
    tgt_kpm = right_padding(B, Tq) if padding else None
    mem_kpm = right_padding(B, Tk) if memory_padding else None
    (y, y_ref), (mem, mem_ref) = twin(B, Tq, d), twin(B, Tk, d)
    want = theirs(
        y_ref,
        mem_ref,
        tgt_mask=square_causal(Tq) if causal else None,
        tgt_key_padding_mask=tgt_kpm,
        memory_key_padding_mask=mem_kpm,
        tgt_is_causal=causal,
    )
    got, _ = ours(
        y,
        mem,
        None if tgt_kpm is None else from_key_padding_mask(tgt_kpm),
        None if mem_kpm is None else from_key_padding_mask(mem_kpm),
        is_causal=causal,
    )
    _backward_and_compare(m, got, want, [(y, y_ref), (mem, mem_ref)], links)


def check_decoder_layer(m: Measure, cases: int = 8) -> None:
    for _ in range(cases):
        H = choice([1, 2, 4])
        d, ff, B = H * randint(2, 5), randint(4, 24), randint(1, 3)
        decoder_layer_case(
            m, d, H, ff, B, randint(1, 6), randint(1, 7), norm_first=choice([False, True]),
            activation=choice(["relu", "gelu"]), padding=choice([False, True]),
            memory_padding=choice([False, True]), causal=choice([False, True]),
        )  # fmt: skip


class Seq2SeqStacks(nn.Module):
    """attnlab's BlockStack + Decoder with final LayerNorms: the shape of ``nn.Transformer``."""

    def __init__(self, d: int, H: int, ff: int, n: int, activation: str, norm_first: bool) -> None:
        super().__init__()
        cfg = _block(d, H, ff, dropout=0.0, activation=activation, norm_first=norm_first)
        self.encoder = BlockStack([Block(cfg) for _ in range(n)], nn.LayerNorm(d))
        self.decoder = Decoder([DecoderBlock(cfg) for _ in range(n)], nn.LayerNorm(d))

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        memory = self.encoder(src, src_mask)
        return self.decoder(tgt, memory, tgt_mask, src_mask, is_causal=True)


def transformer_case(
    m: Measure, d: int, H: int, ff: int, n: int, B: int, Ts: int, Tt: int, *,
    norm_first: bool, activation: str,
) -> None:  # fmt: skip
    """BlockStack + Decoder stacks == nn.Transformer (padded source and target, causal target)."""
    theirs = nn.Transformer(
        d,
        H,
        n,
        n,
        ff,
        dropout=0.0,
        activation=activation,
        batch_first=True,
        norm_first=norm_first,
        dtype=F64,
    )
    ours = Seq2SeqStacks(d, H, ff, n, activation, norm_first).double()
    links = transformer_links(ours, theirs)
    copy_links(links)
    src_kpm, tgt_kpm = right_padding(B, Ts), right_padding(B, Tt)
    (s, s_ref), (t, t_ref) = twin(B, Ts, d), twin(B, Tt, d)
    want = theirs(
        s_ref,
        t_ref,
        tgt_mask=square_causal(Tt),
        src_key_padding_mask=src_kpm,
        tgt_key_padding_mask=tgt_kpm,
        memory_key_padding_mask=src_kpm,
        tgt_is_causal=True,
    )
    got = ours(s, t, from_key_padding_mask(src_kpm), from_key_padding_mask(tgt_kpm))
    _backward_and_compare(m, got, want, [(s, s_ref), (t, t_ref)], links)


def check_transformer(m: Measure, cases: int = 4) -> None:
    for _ in range(cases):
        H = choice([1, 2, 4])
        d, ff, n, B = H * randint(2, 5), randint(4, 24), randint(1, 2), randint(1, 3)
        transformer_case(
            m, d, H, ff, n, B, randint(1, 7), randint(1, 6),
            norm_first=choice([False, True]), activation=choice(["relu", "gelu"]),
        )  # fmt: skip


def _backward_and_compare(
    m: Measure, got: Tensor, want: Tensor, inputs: list[tuple[Tensor, Tensor]], links: list
) -> None:
    m.diff(got, want)
    cot = torch.randn_like(want)
    (got * cot).sum().backward()
    (want * cot).sum().backward()
    compare_grads(m, inputs)
    m.value(max_grad_error(links))
    m.case()
