"""Autoregressive decoding of a GPT: the context window, the KV cache, and sampling.

Window. The model sees at most ``context`` tokens. When a sequence outgrows it, the window
jumps forward so that it holds the last ``context // 2`` tokens, and grows again from there.
With the KV cache the caches are then rebuilt from those tokens (one prefill per half-window);
without it the window is fed whole at every step. Both therefore compute the same logits at
every step, whatever the length.

Sampling. logits / temperature, then top-k, then top-p (nucleus, Holtzman et al. 2020): keep the
smallest set of most likely tokens whose probability reaches p. Temperature 0 is greedy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from attnlab.compress.int8 import Int8KVCache
from attnlab.errors import UserError
from attnlab.layers.attention import KVCache
from attnlab.models.gpt import GPT


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """Reject sampling settings that mean nothing, saying what is allowed."""
    if temperature < 0:
        raise UserError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k < 0:
        raise UserError(f"--top-k must be >= 0 (0 = off), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise UserError(f"--top-p must be in (0, 1] (1 = off), got {top_p}")


def sampling_probs(
    logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> Tensor:
    """The distribution sampled from (B, V): softmax(logits / temperature) after top-k and
    top-p; at temperature 0, one-hot on the argmax (greedy)."""
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        greedy = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        return torch.zeros_like(logits, dtype=torch.float).scatter_(-1, greedy, 1.0)
    logits = logits.float() / temperature  # (B, V)
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (B, V)
        probs = torch.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # (B, V) mass of the more likely tokens
        drop_sorted = before >= top_p  # the most likely token is always kept
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)  # (B, V)


def sample_next(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Next token per row from logits (B, V): greedy at temperature 0, else sampled. -> (B,)."""
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,)
    probs = sampling_probs(logits, temperature, top_k, top_p)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]  # (B,)


KV_CACHES = ("float", "int8")


def new_caches(model: GPT, kv_cache: str = "float") -> list[Any]:
    """The model's decoding caches; with ``kv_cache="int8"`` every full-attention KVCache is an
    Int8KVCache (int8 keys and values, a scale per token and head)."""
    if kv_cache not in KV_CACHES:
        raise UserError(f"--kv-cache must be one of {', '.join(KV_CACHES)}, got {kv_cache!r}")
    caches = model.new_caches()
    if kv_cache == "float":
        return caches
    if not any(type(c) is KVCache for c in caches):
        kinds = sorted({type(c).__name__ for c in caches})
        raise UserError(
            f"--kv-cache int8 compresses full attention's KV cache; this model decodes with "
            f"{', '.join(kinds)} only"
        )
    return [Int8KVCache() if type(c) is KVCache else c for c in caches]


class Generation:
    """The state of decoding a batch of sequences: their ids, window start and KV caches.

    Use: ``logits = g.next_logits()``, pick tokens, ``g.append(tokens)``, repeat; ``keep(rows)``
    drops finished rows. All rows have the same length (one prompt, several samples).
    """

    def __init__(
        self, model: GPT, ids: Tensor, use_cache: bool = True, kv_cache: str = "float"
    ) -> None:
        if ids.dim() != 2 or ids.shape[1] < 1:
            raise UserError(f"prompt ids must be (B, T) with T >= 1, got {tuple(ids.shape)}")
        self.model = model
        self.context = model.cfg.context
        self.ids = ids  # (B, T) everything so far
        self.start = max(0, ids.shape[1] - self.context)  # first id inside the window
        self.use_cache = use_cache
        self.kv_cache = kv_cache
        if use_cache:
            new_caches(model, kv_cache)  # a kind that does not apply is refused before decoding
        self.caches: list[Any] | None = None  # per layer (KV / SSM state), up to `cached`
        self.cached = 0

    def _slide(self) -> None:
        """Move the window forward to the last context // 2 ids once the sequence outgrows it."""
        if self.ids.shape[1] - self.start > self.context:
            self.start = self.ids.shape[1] - max(1, self.context // 2)
            self.caches = None

    @torch.no_grad()
    def next_logits(self) -> Tensor:
        """Logits (B, V) of the token after the current ids."""
        self._slide()
        if not self.use_cache:
            window = self.ids[:, self.start :]  # (B, ≤ context)
            return self.model(window, last_only=True)[:, -1]  # (B, V)
        if self.caches is None:
            self.caches, self.cached = new_caches(self.model, self.kv_cache), self.start
        new = self.ids[:, self.cached :]  # (B, Tnew) not yet in the caches
        self.cached = self.ids.shape[1]
        return self.model(new, caches=self.caches, last_only=True)[:, -1]  # (B, V)

    def append(self, tokens: Tensor) -> None:
        """Add one token per row (B,)."""
        self.ids = torch.cat([self.ids, tokens[:, None].to(self.ids.dtype)], dim=1)  # (B, T+1)

    def keep(self, rows: Tensor) -> None:
        """Continue with the given rows (B',) only, e.g. once the others hit a stop string."""
        self.ids = self.ids.index_select(0, rows)
        for cache in self.caches or []:
            cache.reorder(rows)
