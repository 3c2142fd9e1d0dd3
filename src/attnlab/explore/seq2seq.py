"""Page data of a translation run: decode, then all three attentions of the encoder-decoder.

The sentence is decoded as ``attnlab translate`` does (beam search or greedy); then one
teacher-forced pass over ``<s> y₁ … yₙ`` records the encoder self-attention, the decoder's
causal self-attention and the cross-attention. A cross-attention row is labelled with the token
that step produced (y₁ … yₙ, then ``</s>``), so the matrix reads as a source × target alignment.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.errors import UserError
from attnlab.explore.pack import build_group, calls_named
from attnlab.explore.sources import Source
from attnlab.infer.beam import DecodeSettings, beam_search, greedy_decode
from attnlab.layers.attention_record import record_attention

BOS, EOS, UNK = 1, 2, 3


@torch.no_grad()
def translate_examples(
    source: Source, texts: list[str], beam_size: int | None = None
) -> dict[str, Any]:
    """One example per source sentence."""
    run = source.run
    d, model = run.cfg.data, run.model.eval()
    beam = d.beam_size if beam_size is None else beam_size
    if beam < 1:
        raise UserError(f"--beam-size must be >= 1 (1 = greedy), got {beam}")
    settings = DecodeSettings(BOS, EOS, d.max_len_a, d.max_len_b)
    limit = run.cfg.model.context if run.cfg.model.pos == "learned" else 10_000
    examples = []
    for text in texts:
        src_ids = run.src_tok.encode(text)[:limit] or [UNK]
        src = torch.tensor([src_ids])  # (1, S)
        if beam == 1:
            out = greedy_decode(model, src, settings)[0]
        else:
            out = beam_search(model, src, settings, beam, d.length_penalty)[0]
        tgt_in = torch.tensor([[BOS, *out]])  # (1, T)
        with record_attention(model) as rec:
            model(src, tgt_in)
        src_tokens = [run.src_tok.tok.id_to_token(i) for i in src_ids]
        tgt_tokens = [run.tgt_tok.tok.id_to_token(i) for i in [BOS, *out]]
        produced = [*tgt_tokens[1:], "</s>"]
        calls = rec.calls
        groups = [
            build_group(
                "cross-attention (target × source)",
                calls_named(calls, "cross_attn"),
                0,
                produced,
                src_tokens,
                note="row = the target token produced at that step; column = source token",
            ),
            build_group(
                "encoder self-attention",
                [c for c in calls_named(calls, "self_attn") if c.module.startswith("encoder.")],
                0,
                src_tokens,
                src_tokens,
            ),
            build_group(
                "decoder self-attention (causal)",
                [c for c in calls_named(calls, "self_attn") if c.module.startswith("decoder.")],
                0,
                tgt_tokens,
                tgt_tokens,
                note="row = the decoder's input token (<s> y₁ … yₙ)",
            ),
        ]
        examples.append(
            {
                "input": text,
                "groups": groups,
                "translation": {
                    "text": run.tgt_tok.decode(out),
                    "decoder": "greedy" if beam == 1 else f"beam search, beam {beam}",
                },
            }
        )
    cfg = run.cfg.model
    title = (
        f"translation {source.name} · {cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers × "
        f"{cfg.n_heads} heads · d {cfg.d_model}"
    )
    return {"title": title, "examples": examples}
