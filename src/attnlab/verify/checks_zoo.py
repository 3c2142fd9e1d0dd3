"""Parity of the model zoo (T5, ELECTRA, ALBERT, DeBERTa-v2) against Hugging Face classes.

Each check builds a tiny random HF model, scrambles its weights, copies every tensor into
attnlab's model through a list of :class:`ZLink` (which must cover every attnlab parameter),
runs both on a right-padded batch and compares the outputs on real tokens and every parameter
gradient (a random cotangent on the real positions). T5 and ELECTRA/ALBERT/DeBERTa compute in
float64 (HF's T5 norm, which takes its variance in float32 whatever the input, is run with the
variance in float64 for the comparison).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.verify.checks_hf import _transformers, backward_both, scramble
from attnlab.verify.checks_torch import choice, randint
from attnlab.verify.copy_weights import Link, _cat, _covers, copy_links
from attnlab.verify.runner import Measure

F64 = torch.float64


@dataclass
class ZLink(Link):
    """A :class:`Link` whose gradient combines differently from its value (``grad_join``):
    a weight stored as c·W has gradient (1/c)·dL/dW."""

    grad_join: Callable[..., Tensor] | None = None


def grad_error(links: Sequence[Link]) -> float:
    """Largest |attnlab gradient − the reference gradients combined| over all links."""
    worst = 0.0
    for link in links:
        if link.ours.grad is None:
            raise ValueError(f"no gradient for {link.name}")
        join = getattr(link, "grad_join", None) or link.join
        grads = []
        for t in link.theirs:
            grads.append(torch.zeros_like(t) if t.grad is None else t.grad)
        worst = max(worst, (link.ours.grad - join(*grads)).abs().max().item())
    return worst


def _lin(ours: nn.Linear, theirs: nn.Linear, name: str) -> list[Link]:
    links = [Link(ours.weight, (theirs.weight,), name=f"{name}.weight")]
    if ours.bias is not None:
        links.append(Link(ours.bias, (theirs.bias,), name=f"{name}.bias"))
    return links


def _norm(ours: nn.Module, theirs: nn.Module, name: str) -> list[Link]:
    links = [Link(ours.weight, (theirs.weight,), name=f"{name}.weight")]
    if getattr(ours, "bias", None) is not None:
        links.append(Link(ours.bias, (theirs.bias,), name=f"{name}.bias"))
    return links


def _padded_batch(vocab: int, B: int = 0, pad: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """ids (B, T) right-padded with ``pad``, lengths (B,), real (B, T) bool; row 0 is full."""
    B, T = B or randint(1, 4), randint(2, 14)
    lengths = torch.randint(1, T + 1, (B,))
    lengths[0] = T
    real = torch.arange(T)[None] < lengths[:, None]
    ids = torch.randint(1, vocab, (B, T)).masked_fill(~real, pad)
    return ids, lengths, real


# --------------------------------------------------------------------------- T5


def t5_attention_links(ours: nn.Module, theirs: nn.Module, name: str) -> list[Link]:
    """T5Attention -> MultiHeadAttention(bias=False): qkv = [√d_k·q; k; v], out_proj = o."""
    c = theirs.key_value_proj_dim**0.5
    qkv = ZLink(
        ours.qkv.weight,
        (theirs.q.weight, theirs.k.weight, theirs.v.weight),
        lambda q, k, v: torch.cat([q * c, k, v]),
        f"{name}.qkv",
        grad_join=lambda q, k, v: torch.cat([q / c, k, v]),
    )
    return [qkv, Link(ours.out_proj.weight, (theirs.o.weight,), name=f"{name}.o")]


def t5_ff_links(ours: nn.Module, theirs: nn.Module, name: str) -> list[Link]:
    """T5DenseActDense (wi, wo) or T5DenseGatedActDense (w_in = [wi_0; wi_1], wo)."""
    if hasattr(theirs, "wi_0"):
        w_in = Link(ours.w_in.weight, (theirs.wi_0.weight, theirs.wi_1.weight), _cat, name)
    else:
        w_in = Link(ours.w_in.weight, (theirs.wi.weight,), name=f"{name}.wi")
    return [w_in, Link(ours.w_out.weight, (theirs.wo.weight,), name=f"{name}.wo")]


def t5_links(ours: nn.Module, theirs: nn.Module) -> list[Link]:
    """T5ForConditionalGeneration / T5Model -> attnlab's T5, every parameter."""
    links = [Link(ours.shared.weight, (theirs.shared.weight,), name="shared")]
    enc, dec = theirs.encoder, theirs.decoder
    links.append(
        Link(
            ours.encoder_bias.embedding.weight,
            (enc.block[0].layer[0].SelfAttention.relative_attention_bias.weight,),
            name="encoder relative bias",
        )
    )
    links.append(
        Link(
            ours.decoder_bias.embedding.weight,
            (dec.block[0].layer[0].SelfAttention.relative_attention_bias.weight,),
            name="decoder relative bias",
        )
    )
    for i, (mine, ref) in enumerate(zip(ours.encoder.blocks, enc.block, strict=True)):
        links += t5_attention_links(mine.self_attn, ref.layer[0].SelfAttention, f"enc{i}.attn")
        links += _norm(mine.norm1, ref.layer[0].layer_norm, f"enc{i}.norm1")
        links += t5_ff_links(mine.ff, ref.layer[1].DenseReluDense, f"enc{i}.ff")
        links += _norm(mine.norm2, ref.layer[1].layer_norm, f"enc{i}.norm2")
    for i, (mine, ref) in enumerate(zip(ours.decoder.blocks, dec.block, strict=True)):
        links += t5_attention_links(mine.self_attn, ref.layer[0].SelfAttention, f"dec{i}.attn")
        links += _norm(mine.norm1, ref.layer[0].layer_norm, f"dec{i}.norm1")
        links += t5_attention_links(mine.cross_attn, ref.layer[1].EncDecAttention, f"dec{i}.x")
        links += _norm(mine.norm2, ref.layer[1].layer_norm, f"dec{i}.norm2")
        links += t5_ff_links(mine.ff, ref.layer[2].DenseReluDense, f"dec{i}.ff")
        links += _norm(mine.norm3, ref.layer[2].layer_norm, f"dec{i}.norm3")
    links += _norm(ours.encoder.norm, enc.final_layer_norm, "encoder.final_layer_norm")
    links += _norm(ours.decoder.norm, dec.final_layer_norm, "decoder.final_layer_norm")
    return _covers(ours, links)


@contextmanager
def t5_norm_in_input_dtype() -> Iterator[None]:
    """HF's T5LayerNorm takes its variance in float32 even for float64 inputs; while active it
    keeps the input's dtype (the same formula), so that a float64 comparison is exact."""
    from transformers.models.t5 import modeling_t5

    def forward(self: nn.Module, h: Tensor) -> Tensor:
        variance = h.pow(2).mean(-1, keepdim=True)
        return self.weight * (h * torch.rsqrt(variance + self.variance_epsilon))

    original = modeling_t5.T5LayerNorm.forward
    modeling_t5.T5LayerNorm.forward = forward
    try:
        yield
    finally:
        modeling_t5.T5LayerNorm.forward = original


def check_t5_model(m: Measure, cases: int = 4) -> None:
    """T5ForConditionalGeneration (v1.0 relu with scaled output, v1.1 gated-gelu without) ==
    attnlab's T5: encoder states and logits on real tokens of right-padded source and target
    batches, and every parameter gradient; float64 (HF's norm variance kept in float64:
    :func:`t5_norm_in_input_dtype`)."""
    with t5_norm_in_input_dtype():
        _check_t5_model(m, cases)


def _check_t5_model(m: Measure, cases: int) -> None:
    from attnlab.models.t5 import T5, T5Config

    tf = _transformers()
    for i in range(cases):
        v11 = i % 2 == 1
        H, dk = randint(1, 4), randint(2, 6)
        buckets = randint(4, 16)
        hf_cfg = tf.T5Config(
            vocab_size=randint(20, 60),
            d_model=H * dk,
            d_kv=dk,
            d_ff=randint(8, 40),
            num_layers=randint(1, 3),
            num_decoder_layers=randint(1, 3),
            num_heads=H,
            relative_attention_num_buckets=buckets,
            relative_attention_max_distance=randint(buckets // 2 + 1, 40),
            dropout_rate=0.0,
            feed_forward_proj="gated-gelu" if v11 else "relu",
            tie_word_embeddings=not v11,
        )
        hf_cfg._attn_implementation = "eager"
        hf = scramble(tf.T5ForConditionalGeneration(hf_cfg), 0.3).double().eval()
        cfg = T5Config(
            vocab_size=hf_cfg.vocab_size,
            d_model=hf_cfg.d_model,
            n_heads=H,
            d_ff=hf_cfg.d_ff,
            n_layers=hf_cfg.num_layers,
            n_decoder_layers=hf_cfg.num_decoder_layers,
            num_buckets=buckets,
            max_distance=hf_cfg.relative_attention_max_distance,
            activation="geglu_tanh" if v11 else "relu",
            scale_output=not v11,
            norm_eps=hf_cfg.layer_norm_epsilon,
            dropout=0.0,
        )
        ours = T5(cfg).double().eval()
        if hf.lm_head.weight.data_ptr() != hf.shared.weight.data_ptr():
            raise AssertionError("HF T5's lm_head is not tied to the shared embedding")
        links = t5_links(ours, hf)
        copy_links(links)
        src, src_len, src_real = _padded_batch(cfg.vocab_size)
        tgt, tgt_len, tgt_real = _padded_batch(cfg.vocab_size, B=src.shape[0])
        out = hf(
            input_ids=src,
            attention_mask=src_real.long(),
            decoder_input_ids=tgt,
            decoder_attention_mask=tgt_real.long(),
        )
        memory = ours.encode(src, src_len)
        got = ours.logits(ours.decode(tgt, memory, src_len, tgt_len))
        m.diff(memory[src_real], out.encoder_last_hidden_state[src_real], "encoder states")
        m.diff(got[tgt_real], out.logits[tgt_real], "logits")
        backward_both(got, out.logits, tgt_real[..., None])
        m.value(grad_error(links))
        m.case()
