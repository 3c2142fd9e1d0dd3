"""Decoding caches of attnlab.infer.generation: the float KV cache gives the logits of
uncached decoding (float64, to 1e-12) and so the same greedy tokens; the int8 KV cache holds
keys and values within the bound of its per-token, per-head scales, and decodes close to the
float cache; a --kv-cache that does not exist or does not apply is refused."""

from __future__ import annotations

import pytest
import torch

from attnlab.compress.int8 import Int8KVCache, quantize_per_head_token
from attnlab.errors import UserError
from attnlab.infer.generation import Generation, new_caches
from attnlab.models.gpt import GPT, GPTConfig


def gpt(**kw) -> GPT:
    cfg = dict(vocab_size=17, context=24, n_layers=2, n_heads=4, n_kv_heads=2, d_model=16)
    return GPT(GPTConfig(**{**cfg, **kw})).double().eval()


def decode(model: GPT, prompt: torch.Tensor, n: int, **kw) -> tuple[list[torch.Tensor], list]:
    gen = Generation(model, prompt, **kw)
    logits = []
    for _ in range(n):
        logits.append(gen.next_logits())
        gen.append(logits[-1].argmax(-1))
    return logits, gen.ids[0].tolist()


@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
def test_float_cache_equals_uncached_decoding(pos: str) -> None:
    model = gpt(pos=pos)
    prompt = torch.randint(0, 17, (1, 5))
    cached, ids = decode(model, prompt, 40)  # slides past the context of 24
    uncached, ids_plain = decode(model, prompt, 40, use_cache=False)
    assert ids == ids_plain
    for a, b in zip(cached, uncached):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_int8_cache_holds_keys_within_the_bound_of_its_scales() -> None:
    cache = Int8KVCache()
    parts = [torch.randn(2, 3, t, 8) * torch.rand(2, 3, t, 1) * 4 for t in (5, 1, 1, 20)]
    for part in parts:
        keys, values = cache.append(part, -part)
    full = torch.cat(parts, dim=2)  # (B, H, T, D)
    _, scale = quantize_per_head_token(full)
    assert ((keys - full).abs() <= scale / 2 + 1e-6).all()
    assert ((values + full).abs() <= scale / 2 + 1e-6).all()
    assert (keys != full).any()  # it is quantised
    assert cache.nbytes_per_token() == 2 * 3 * (8 + 4)


def test_int8_cache_decodes_close_to_the_float_cache() -> None:
    torch.manual_seed(0)
    model = gpt()
    prompt = torch.randint(0, 17, (1, 6))
    want, _ = decode(model, prompt, 30)
    got, _ = decode(model, prompt, 30, kv_cache="int8")
    err = max(float((a - b).abs().max()) for a, b in zip(got, want))
    assert 0 < err < 0.05, err


def test_kv_cache_kinds_that_do_not_exist_or_apply_are_refused() -> None:
    with pytest.raises(UserError, match="--kv-cache must be one of float, int8"):
        new_caches(gpt(), "fp8")
    local = gpt(attention="local", window=4)
    with pytest.raises(UserError, match="SlidingWindowCache"):
        Generation(local, torch.tensor([[1]]), kv_cache="int8")
    assert new_caches(local, "float")  # the sliding-window cache itself is still there
