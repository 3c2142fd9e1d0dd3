"""Seq2SeqTransformer against torch.nn.Transformer, and greedy/beam decoding with caches."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from attnlab.infer.beam import DecodeSettings, beam_search, greedy_decode, length_penalty
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.verify.copy_weights import assert_grads_match, copy_links, transformer_links

PAD, BOS, EOS = 0, 1, 2


def _config(**kw) -> Seq2SeqConfig:
    base = dict(
        src_vocab_size=23,
        tgt_vocab_size=23,
        d_model=16,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=24,
        dropout=0.0,
    )
    return Seq2SeqConfig(**(base | kw))


def _padded(lengths: list[int], vocab: int, start: int = 3) -> torch.Tensor:
    """Random ids (B, max length), right-padded with PAD."""
    ids = torch.randint(start, vocab, (len(lengths), max(lengths)))
    for b, n in enumerate(lengths):
        ids[b, n:] = PAD
    return ids


class Reference(nn.Module):
    """nn.Transformer with attnlab's embeddings, positions and tied projection."""

    def __init__(self, ours: Seq2SeqTransformer, norm_first: bool) -> None:
        super().__init__()
        c = ours.cfg
        self.ours = ours
        self.transformer = nn.Transformer(
            c.d_model,
            c.n_heads,
            c.n_encoder_layers,
            c.n_decoder_layers,
            c.d_ff,
            dropout=0.0,
            batch_first=True,
            norm_first=norm_first,
        )

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        o = self.ours
        scale = math.sqrt(o.cfg.d_model)
        s = o.pos(o.src_embed(src) * scale)
        t = o.pos(o.tgt_embed(tgt) * scale)
        n = tgt.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)  # True = blocked
        h = self.transformer(
            s,
            t,
            tgt_mask=causal,
            src_key_padding_mask=src == PAD,
            tgt_key_padding_mask=tgt == PAD,
            memory_key_padding_mask=src == PAD,
        )
        return h @ o.tgt_embed.weight.T


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("shared", [True, False])
def test_matches_nn_transformer_forward_and_gradients(norm_first: bool, shared: bool) -> None:
    cfg = _config(
        norm_position="pre" if norm_first else "post",
        shared_embeddings=shared,
        tgt_vocab_size=23 if shared else 19,
    )
    ours = Seq2SeqTransformer(cfg).double()
    ref = Reference(ours, norm_first).double()
    stacks = nn.Module()  # the encoder and decoder only; the embeddings are shared as they are
    stacks.encoder, stacks.decoder = ours.encoder, ours.decoder
    links = transformer_links(stacks, ref.transformer)
    copy_links(links)
    src = _padded([7, 4, 1], cfg.src_vocab_size)
    tgt = _padded([5, 6, 2], cfg.tgt_vocab_size)
    tgt[:, 0] = BOS
    got = ours(src, tgt)
    want = ref(src, tgt)
    real = tgt != PAD
    torch.testing.assert_close(got[real], want[real], rtol=1e-10, atol=1e-10)
    # Gradients of a loss on the real positions, through every weight (tied ones included).
    weights = torch.randn_like(got)
    (got[real] * weights[real]).sum().backward()
    embeds = {n: p for n, p in ours.named_parameters() if "embed" in n}
    grads_ours = {n: p.grad.clone() for n, p in embeds.items()}
    for p in embeds.values():
        p.grad = None
    (want[real] * weights[real]).sum().backward()
    assert_grads_match(links)
    for n, p in embeds.items():  # used by both graphs: compare the two passes
        torch.testing.assert_close(grads_ours[n], p.grad, rtol=1e-9, atol=1e-10)
        assert p.grad.abs().sum() > 0


def test_padding_does_not_change_real_outputs() -> None:
    model = Seq2SeqTransformer(_config()).double().eval()
    src = _padded([6], 23)
    tgt = _padded([4], 23)
    tgt[:, 0] = BOS
    alone = model(src, tgt)
    padded_src = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    padded_tgt = torch.cat([tgt, torch.zeros(1, 2, dtype=torch.long)], dim=1)
    together = model(padded_src, padded_tgt)
    torch.testing.assert_close(together[:, :4], alone, rtol=1e-10, atol=1e-10)
    assert torch.isfinite(together).all()  # padded query rows give finite values


def test_causal_future_tokens_do_not_leak() -> None:
    model = Seq2SeqTransformer(_config()).double().eval()
    src = _padded([5], 23)
    tgt = _padded([6], 23)
    changed = tgt.clone()
    changed[0, 4:] = 3 + (changed[0, 4:] - 2) % 20
    torch.testing.assert_close(model(src, tgt)[:, :4], model(src, changed)[:, :4])
    assert not torch.allclose(model(src, tgt)[:, 4:], model(src, changed)[:, 4:])


def test_tied_and_scaled_embeddings() -> None:
    model = Seq2SeqTransformer(_config(shared_embeddings=False, tgt_vocab_size=19))
    assert model.out_proj.weight is model.tgt_embed.weight
    assert model.src_embed is not model.tgt_embed
    shared = Seq2SeqTransformer(_config())
    assert shared.src_embed is shared.tgt_embed
    with pytest.raises(ValueError, match="shared_embeddings"):
        Seq2SeqTransformer(_config(tgt_vocab_size=19))


def _trained_like(**kw) -> Seq2SeqTransformer:
    """A random model whose EOS logit is boosted so hypotheses end at varied lengths."""
    model = Seq2SeqTransformer(_config(n_decoder_layers=2, **kw)).eval()
    with torch.no_grad():
        model.tgt_embed.weight[EOS] *= 3.0
    return model


def test_cached_greedy_equals_uncached_and_beam_one() -> None:
    model = _trained_like()
    src = _padded([7, 3, 5, 1], 23)
    settings = DecodeSettings(BOS, EOS, max_len_a=1.0, max_len_b=4)
    cached = greedy_decode(model, src, settings)
    uncached = greedy_decode(model, src, DecodeSettings(BOS, EOS, 1.0, 4, use_cache=False))
    assert cached == uncached
    assert beam_search(model, src, settings, beam_size=1) == cached
    assert beam_search(model, src, settings, beam_size=1, early_stopping=False, alpha=0.0) == cached
    for hyp, n in zip(cached, [7, 3, 5, 1]):
        assert len(hyp) <= n + 4 and EOS not in hyp and BOS not in hyp


@torch.no_grad()
def _sequence_logprob(model: Seq2SeqTransformer, src: torch.Tensor, hyp: list[int]) -> float:
    tgt = torch.tensor([[BOS, *hyp, EOS]])
    logp = model(src, tgt[:, :-1]).log_softmax(-1)[0]
    return logp.gather(1, tgt[0, 1:, None]).sum().item()


def test_beam_search_cached_equals_uncached_and_is_batch_invariant() -> None:
    model = _trained_like()
    src = _padded([6, 2, 4], 23)
    settings = DecodeSettings(BOS, EOS, max_len_a=1.0, max_len_b=3)
    beams = beam_search(model, src, settings, beam_size=4, alpha=0.0, early_stopping=False)
    uncached = beam_search(
        model, src, DecodeSettings(BOS, EOS, 1.0, 3, use_cache=False), 4, 0.0, False
    )
    assert beams == uncached
    for b, n in enumerate([6, 2, 4]):
        one = src[b : b + 1, :n]
        assert beam_search(model, one, settings, 4, 0.0, False)[0] == beams[b]  # batch-invariant
        assert len(beams[b]) <= n + 3 and EOS not in beams[b]


@torch.no_grad()
def test_beam_search_finds_the_exhaustive_best() -> None:
    """Tiny vocabulary, 3-token limit, 8 beams (every prefix): beam search is exhaustive."""
    model = Seq2SeqTransformer(_config(src_vocab_size=5, tgt_vocab_size=5)).double().eval()
    with torch.no_grad():
        model.tgt_embed.weight[EOS] *= 2.0
    src = torch.tensor([[3, 4, 3]])
    settings = DecodeSettings(BOS, EOS, max_len_a=0.0, max_len_b=3)
    best = beam_search(model, src, settings, beam_size=8, alpha=0.0, early_stopping=False)[0]
    others = [3, 4]  # PAD and BOS are never generated
    scored: dict[tuple[int, ...], float] = {}
    for n in range(4):  # n tokens then EOS (n < 3), or 3 tokens cut at the limit
        for hyp in itertools.product(others, repeat=n):
            tgt = torch.tensor([[BOS, *hyp] + ([EOS] if n < 3 else [])])
            logp = model(src, tgt[:, :-1]).log_softmax(-1)[0]
            scored[hyp] = logp.gather(1, tgt[0, 1:, None]).sum().item()
    assert tuple(best) == max(scored, key=scored.get)


def test_length_penalty_and_bad_beam() -> None:
    assert length_penalty(1, 0.0) == 1.0
    assert length_penalty(7, 1.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(_trained_like(), _padded([3], 23), DecodeSettings(BOS, EOS), beam_size=0)


EFFICIENT = [dict(attention="local", window=3), dict(attention="linear")]


@pytest.mark.parametrize("kind", EFFICIENT, ids=["local", "linear"])
def test_efficient_self_attention_decodes_the_same_cached_and_uncached(kind: dict) -> None:
    """Local and linear self-attention: each kernel's own decoding cache (sliding window,
    running sums) gives the same greedy and beam output as recomputing the prefix."""
    model = _trained_like(**kind)
    src = _padded([7, 3, 5], 23)
    settings = DecodeSettings(BOS, EOS, max_len_a=1.0, max_len_b=4)
    uncached = DecodeSettings(BOS, EOS, 1.0, 4, use_cache=False)
    assert greedy_decode(model, src, settings) == greedy_decode(model, src, uncached)
    beams = beam_search(model, src, settings, beam_size=3, alpha=0.0, early_stopping=False)
    assert beams == beam_search(model, src, uncached, 3, 0.0, False)


def test_local_attention_wider_than_the_text_is_full_attention() -> None:
    full = _trained_like()
    local = _trained_like(attention="local", window=64)
    local.load_state_dict(full.state_dict())
    src, tgt = _padded([7, 3, 5], 23), _padded([6, 6, 2], 23)
    torch.testing.assert_close(local(src, tgt), full(src, tgt), atol=1e-5, rtol=1e-5)


def test_bad_attention_kind_is_named() -> None:
    with pytest.raises(ValueError, match="attention"):
        Seq2SeqTransformer(_config(attention="sparse"))
