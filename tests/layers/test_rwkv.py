"""RWKV (attnlab.layers.rwkv): the parallel (chunked) wkv equals the recurrence, the layers decode
from their cache what the full forward computes, and the RWKV GPT equals Hugging Face's
RwkvForCausalLM with copied weights.

* wkv_chunked == wkv_sequential in float64: outputs, the final state (as the true sums
  num·e^m, den·e^m) and the gradients of w, u, k, v and of the initial state, for lengths that
  are and are not multiples of the chunk;
* large keys and fast decays (exponents far past float32's range): finite, equal to the
  recurrence;
* TimeMix / ChannelMix / RwkvBlock: prefill + one-token steps + a multi-token piece == one
  forward; the cache has a fixed size and reorders rows;
* the GPT with mixer "rwkv" vs ``transformers.RwkvForCausalLM`` (its CPU path): logits,
  greedy output, cached decode and every parameter gradient (verify's checks, called here).
"""

from __future__ import annotations

import pytest
import torch

from attnlab.layers.blocks import make_norm
from attnlab.layers.rwkv import ChannelMix, RwkvBlock, TimeMix, wkv_chunked, wkv_sequential

F64 = torch.float64


def wkv_inputs(B: int, T: int, D: int, dtype=F64, scale: float = 3.0):
    w = torch.exp(torch.randn(D, dtype=dtype))  # decay rates > 0
    u = torch.randn(D, dtype=dtype)
    k = torch.randn(B, T, D, dtype=dtype) * scale
    v = torch.randn(B, T, D, dtype=dtype)
    state = (
        torch.randn(B, D, dtype=dtype),
        torch.rand(B, D, dtype=dtype) + 0.1,
        torch.randn(B, D, dtype=dtype),
    )
    return [w, u, k, v], list(state)


def true_sums(state):
    num, den, m = state
    return num * m.exp(), den * m.exp()


@pytest.mark.parametrize("T, chunk", [(1, 16), (7, 4), (16, 4), (37, 8), (5, 16), (33, 1), (90, 0)])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("far", [False, True])
def test_chunked_wkv_equals_the_recurrence_forward_and_backward(T, chunk, with_state, far):
    """``far``: two keys ±400 apart in the first chunk, past the range of the matrix form, so
    the chunks take the exact form (a chunk of one position keeps the matrix form)."""
    args, state = wkv_inputs(2, T, 5)
    if far:
        args[2][:, 0] += 400.0
        args[2][:, 1:2] -= 400.0
    leaves = [t.requires_grad_() for t in args + state]
    st = tuple(state) if with_state else None
    y1, s1 = wkv_sequential(*args, st)
    y2, s2 = wkv_chunked(*args, st, chunk=chunk)
    torch.testing.assert_close(y2, y1, rtol=1e-10, atol=1e-12)
    for a, b in zip(true_sums(s2), true_sums(s1)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    gy = torch.randn_like(y1)
    wrt = leaves if with_state else leaves[:4]

    def loss(y, s):
        num, den = true_sums(s)
        return (y * gy).sum() + num.sum() + 0.5 * den.sum()

    g1 = torch.autograd.grad(loss(y1, s1), wrt)
    g2 = torch.autograd.grad(loss(y2, s2), wrt)
    for name, a, b in zip(("w", "u", "k", "v", "num", "den", "m"), g2, g1):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=name)


def test_chunked_wkv_stays_finite_with_large_keys_and_fast_decay():
    args, _ = wkv_inputs(1, 200, 4, dtype=torch.float32, scale=60.0)  # e^k far past 1e38
    args[0] = args[0] * 40  # decays of e^-40 and faster per step
    y1, _ = wkv_sequential(*args)
    y2, _ = wkv_chunked(*args, chunk=64)
    assert torch.isfinite(y2).all()
    torch.testing.assert_close(y2, y1, rtol=1e-4, atol=1e-4)


def scrambled(module: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return module.double()


def test_layers_decode_from_their_cache_what_the_full_forward_computes():
    block = scrambled(
        RwkvBlock(
            TimeMix(12, 0, 2, chunk=4), ChannelMix(12, 20), lambda: make_norm("layer", 12), True
        )
    )
    x = torch.randn(2, 19, 12, dtype=F64)
    with torch.no_grad():
        want, _ = block(x)
        cache = block.new_cache()
        pieces = [block(x[:, :5], cache=cache)[0]]  # prefill (chunked wkv)
        pieces += [block(x[:, t : t + 1], cache=cache)[0] for t in range(5, 12)]  # recurrence
        pieces.append(block(x[:, 12:], cache=cache)[0])  # several tokens from the state
    torch.testing.assert_close(torch.cat(pieces, dim=1), want, rtol=1e-10, atol=1e-12)
    assert cache.length == 19 and cache.nbytes() == 5 * 2 * 12 * 8  # 2 shifts + 3 wkv sums
    with torch.no_grad():  # rows reordered: the survivors continue as if alone
        nxt = torch.randn(2, 1, 12, dtype=F64)
        full, _ = block(nxt, cache=cache)
        cache.reorder(torch.tensor([1]))
    alone = block.new_cache()
    with torch.no_grad():
        block(x[1:], cache=alone)
        torch.testing.assert_close(block(nxt[1:], cache=alone)[0], full[1:], rtol=0, atol=1e-12)


def test_time_mix_forms_agree_on_every_gradient():
    fast = scrambled(TimeMix(10, 1, 3, chunk=4))
    slow = scrambled(TimeMix(10, 1, 3))
    slow.load_state_dict(fast.state_dict())
    slow.form = "sequential"
    x = torch.randn(3, 13, 10, dtype=F64)
    y1, y2 = fast(x), slow(x)
    torch.testing.assert_close(y1, y2, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(y1)
    (y1 * g).sum().backward()
    (y2 * g).sum().backward()
    for (name, p1), p2 in zip(fast.named_parameters(), slow.parameters()):
        assert p1.grad.abs().sum() > 0, name
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-9, atol=1e-11, msg=name)


def test_init_follows_rwkv4_by_depth():
    first, last = TimeMix(8, 0, 4), TimeMix(8, 3, 4)
    assert torch.all(first.time_mix_key <= last.time_mix_key + 1e-7)  # upper layers mix less
    assert first.time_decay[0] == -5 and first.time_decay[-1] == 3  # -5 + 8 h^(0.7+1.3 r)
    with pytest.raises(ValueError, match="chunk"):
        wkv_chunked(*wkv_inputs(1, 3, 2)[0], chunk=-1)


@pytest.mark.parametrize("what", ["logits/greedy/cache", "gradients"])
def test_the_rwkv_gpt_matches_hugging_face(what):
    """The GPT with mixer "rwkv" (weights copied from a random RwkvForCausalLM): logits, greedy
    output, cached decode, every parameter gradient (verify's checks, held to verify's
    tolerances)."""
    pytest.importorskip("transformers")
    from _verify import assert_verified
    from attnlab.verify import checks_mixers
    from attnlab.verify.check import Measure

    check = {
        "logits/greedy/cache": checks_mixers.check_rwkv_logits,
        "gradients": checks_mixers.check_rwkv_grads,
    }[what]
    m = Measure()
    check(m)
    assert_verified(m, f"RWKV GPT {what} (f32)")


@pytest.mark.parametrize("T", [1, 5, 23])
def test_wkv_weights_are_the_attention_that_wkv_computes(T):
    """Σ_i α[t, i] v_i == the recurrence's wkv_t (float64), rows are distributions over i <= t."""
    from attnlab.layers.rwkv import wkv_weights

    (w, u, k, v), _ = wkv_inputs(2, T, 6)
    alpha = wkv_weights(w, u, k)  # (B, D, T, T)
    want, _ = wkv_sequential(w, u, k, v)  # (B, T, D)
    got = torch.einsum("bdts,bsd->btd", alpha, v)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(alpha.sum(-1), torch.ones_like(alpha.sum(-1)))
    assert (alpha.triu(1) == 0).all()  # nothing from the future


def test_recorded_time_mix_weights_are_its_channel_groups():
    from attnlab.layers.attention_record import record_attention
    from attnlab.layers.rwkv import wkv_weights

    mix = TimeMix(8, 0, 2).double()
    mix.view_heads = 2
    x = torch.randn(1, 6, 8, dtype=F64)
    with record_attention(mix) as rec:
        mix(x)
    (call,) = rec.calls
    shifted = torch.nn.functional.pad(x[:, :-1], (0, 0, 1, 0))
    k = mix.key(x * mix.time_mix_key + shifted * (1 - mix.time_mix_key))
    alpha = wkv_weights(torch.exp(mix.time_decay), mix.time_first, k)  # (1, 8, 6, 6)
    torch.testing.assert_close(call.weights, alpha.reshape(1, 2, 4, 6, 6).mean(2))
    torch.testing.assert_close(torch.softmax(call.scores.masked_fill(~call.mask, -torch.inf), -1),
                               call.weights)  # fmt: skip


def test_one_token_rows_of_a_batch_match_hugging_face_row_by_row():
    """A batch of one-token rows (the case HF's RWKV gets wrong as a batch, returning (B, B, V)
    logits, so verify compares it row by row): the GPT's logits equal HF's on each row alone."""
    pytest.importorskip("transformers")
    from attnlab.verify import checks_mixers

    hf, ours, _ = checks_mixers.rwkv_pair(checks_mixers._transformers())
    hf.eval()
    ours.eval()
    ids = torch.randint(0, hf.config.vocab_size, (3, 1))
    with torch.no_grad():
        want = torch.cat([hf(input_ids=row).logits for row in ids.split(1)])  # (3, 1, V)
        got = ours(ids)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
