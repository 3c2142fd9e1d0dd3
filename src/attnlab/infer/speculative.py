"""Speculative decoding: a cheap drafter proposes K tokens, the target checks them in one pass.

Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023 (Algorithm 2). Each round, with the
sequence x so far:

1. the drafter proposes x̃_1..x̃_K, drawn from its distributions q_1..q_K;
2. the target runs once, over x̃_1..x̃_K appended to its KV cache, giving p_1..p_{K+1};
3. for i = 1..K: accept x̃_i with probability min(1, p_i(x̃_i) / q_i(x̃_i)); at the first
   rejection emit a token drawn from norm(max(0, p_i − q_i)) and end the round;
4. if all K were accepted, emit a bonus token drawn from p_{K+1}.

Every emitted token is then distributed exactly as the target's own sample (Leviathan et al.,
Theorem 1): P(emit y) = min(p(y), q(y)) + (1 − Σ min(p, q)) · max(0, p(y) − q(y)) / Σ max(0, p − q)
= p(y). The distributions p and q are those the sampler draws from (temperature, top-k, top-p
applied: :func:`attnlab.infer.generation.sampling_probs`); at temperature 0 both are one-hot
and the rule reduces to "accept while the draft equals the target's argmax", so the output is the
target's greedy output token for token.

Drafters: another (smaller) GPT with the same vocabulary (:class:`ModelDrafter`, its own KV
cache), or no model at all: prompt lookup (:class:`NgramDrafter`, Saxena 2023; HF's
``prompt_lookup_num_tokens``): find the latest earlier occurrence of the sequence's last n-gram
and propose the tokens that followed it; its q is one-hot on the proposal.

Context window: the same rule as :class:`attnlab.infer.generation.Generation` (when the
sequence outgrows the context, the window jumps to the last context // 2 tokens); a round never
proposes past the end of the current window, so every logit is computed over the same window as
plain decoding would use. Rejected positions are cut from the KV caches (a KVCache is cropped;
other caches are rebuilt from the kept tokens). One sequence at a time (batch 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from attnlab.compress.int8 import Int8KVCache
from attnlab.errors import UserError
from attnlab.infer.generation import check_sampling, new_caches, sampling_probs
from attnlab.layers.attention import KVCache
from attnlab.models.gpt import GPT


@dataclass
class SpeculativeStats:
    """What a speculative decode did: rounds (= target passes), tokens proposed and accepted."""

    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "rounds": self.rounds,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "emitted": self.emitted,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_round": self.emitted / self.rounds if self.rounds else 0.0,
        }


class _CachedModel:
    """A GPT with its caches over one window of the sequence: ``start`` .. ``cached``."""

    def __init__(self, model: GPT, kv_cache: str = "float") -> None:
        self.model, self.kv_cache = model, kv_cache
        self.context = model.cfg.context
        self.caches: list[Any] | None = None
        self.start = 0
        self.cached = 0

    def window_start(self, n: int, start: int) -> int:
        """The window start for a sequence of n tokens (Generation's rule)."""
        if n - start > self.context:
            return n - max(1, self.context // 2)
        return start

    @torch.no_grad()
    def logits(self, ids: Tensor, start: int) -> Tensor:
        """Logits (1, n − cached, V) of the positions of ids (1, n) not yet in the caches."""
        if self.caches is None or start != self.start:
            self.caches, self.start, self.cached = (
                new_caches(self.model, self.kv_cache),
                start,
                start,
            )
        out = self.model(ids[:, self.cached :], caches=self.caches)  # (1, Tnew, V)
        self.cached = ids.shape[1]
        return out

    def rollback(self, n: int) -> None:
        """Keep the caches of the first n positions only."""
        if self.caches is None or self.cached <= n:
            return
        if n <= self.start:  # the window had moved past the kept tokens: start afresh
            self.caches = None
            return
        if all(type(c) in (KVCache, Int8KVCache) for c in self.caches):
            for cache in self.caches:
                cache.length = n - self.start  # the rest is overwritten by the next append
            self.cached = n
        else:  # a cache that cannot be cut (sliding window, SSM state): rebuild it
            self.caches = None


class Drafter(Protocol):
    """Proposes up to k tokens after ids (1, n): (tokens, q (len, V) or None for one-hot)."""

    def propose(
        self, ids: Tensor, k: int, sampling: tuple[float, int, float], generator: Any
    ) -> tuple[list[int], Tensor | None]: ...

    def rollback(self, n: int) -> None: ...

    def reset(self) -> None: ...


class ModelDrafter:
    """A small GPT (same vocabulary as the target) sampled autoregressively with its own cache."""

    def __init__(self, draft: GPT) -> None:
        self.cached = _CachedModel(draft.eval())
        self.start = 0

    def propose(
        self, ids: Tensor, k: int, sampling: tuple[float, int, float], generator: Any
    ) -> tuple[list[int], Tensor]:
        tokens, qs = [], []
        seq = ids
        if self.start >= ids.shape[1]:  # the draft's window had slid over rejected tokens
            self.start = max(0, ids.shape[1] - max(1, self.cached.context // 2))
        for _ in range(k):
            self.start = self.cached.window_start(seq.shape[1], self.start)
            logits = self.cached.logits(seq, self.start)[:, -1]  # (1, V)
            q = sampling_probs(logits, *sampling)  # (1, V)
            if sampling[0] == 0:
                token = int(q.argmax())
            else:
                token = int(torch.multinomial(q, 1, generator=generator))
            tokens.append(token)
            qs.append(q[0])
            seq = torch.cat([seq, seq.new_tensor([[token]])], dim=1)  # (1, n + i + 1)
        return tokens, torch.stack(qs)  # (k, V)

    def rollback(self, n: int) -> None:
        self.cached.rollback(n)

    def reset(self) -> None:
        """Forget the caches (a new sequence starts)."""
        self.cached.caches, self.start = None, 0


class NgramDrafter:
    """Prompt lookup: the tokens that followed the latest earlier match of the last n-gram
    (n from ``max_ngram`` down to 1); nothing when no n-gram recurs."""

    def __init__(self, max_ngram: int = 3) -> None:
        if max_ngram < 1:
            raise UserError(f"--ngram must be >= 1, got {max_ngram}")
        self.max_ngram = max_ngram

    def propose(
        self, ids: Tensor, k: int, sampling: tuple[float, int, float], generator: Any
    ) -> tuple[list[int], None]:
        seq = ids[0].tolist()
        n = len(seq)
        for size in range(min(self.max_ngram, n - 1), 0, -1):
            tail = seq[n - size :]
            for start in range(n - size - 1, -1, -1):  # latest match first, not the tail itself
                if seq[start : start + size] == tail:
                    follow = seq[start + size : start + size + k]
                    return follow, None
        return [], None

    def rollback(self, n: int) -> None:
        pass

    def reset(self) -> None:
        pass


def check_lookahead(lookahead: int) -> None:
    if lookahead < 1:
        raise UserError(f"--lookahead must be >= 1 (tokens drafted per round), got {lookahead}")


def check_draft(target: GPT, draft: GPT) -> None:
    """The draft must speak the target's vocabulary."""
    if draft.cfg.vocab_size != target.cfg.vocab_size:
        raise UserError(
            f"the draft's vocabulary has {draft.cfg.vocab_size} tokens, the target's "
            f"{target.cfg.vocab_size}: a draft must use the target's tokenizer"
        )


def _accept(
    p: Tensor, q: Tensor | None, token: int, generator: Any, greedy: bool
) -> tuple[bool, int]:
    """One step of the rule: (accepted, token to emit). p (V,) target, q (V,) draft or None
    for a one-hot proposal."""
    if greedy:  # p is one-hot on the target's argmax
        best = int(p.argmax())
        return best == token, best
    q_x = 1.0 if q is None else float(q[token])
    r = float(torch.rand((), generator=generator))
    if r * q_x < float(p[token]):  # r < p(x) / q(x)
        return True, token
    if q is None:
        residual = p.clone()
        residual[token] = 0.0  # max(0, p − onehot) off x is p itself
    else:
        residual = (p - q).clamp_min(0.0)  # (V,)
    if float(residual.sum()) <= 0.0:  # only by rounding: p == q
        residual = p
    return False, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


@torch.no_grad()
def speculative_decode(
    target: GPT,
    ids: Tensor,
    max_new_tokens: int,
    drafter: Drafter,
    lookahead: int = 4,
    *,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    on_token: Callable[[int], bool] | None = None,
    kv_cache: str = "float",
) -> tuple[list[int], SpeculativeStats]:
    """Continue ids (1, T) by up to ``max_new_tokens`` tokens; returns (tokens, stats).

    ``on_token(token)`` sees every emitted token in order and returns True to stop (a stop
    string). The output is distributed as ``target``'s own sampling with the same settings
    (greedy at temperature 0: identical tokens).
    """
    check_lookahead(lookahead)
    check_sampling(temperature, top_k, top_p)
    if ids.dim() != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
        raise UserError(f"speculative decoding takes one prompt (1, T), got {tuple(ids.shape)}")
    sampling = (temperature, top_k, top_p)
    greedy = temperature == 0
    model = _CachedModel(target.eval(), kv_cache)
    drafter.reset()
    start = max(0, ids.shape[1] - model.context)
    stats = SpeculativeStats()
    out: list[int] = []
    while len(out) < max_new_tokens:
        n = ids.shape[1]
        start = model.window_start(n, start)
        room = model.context - (n - start)  # positions left in this window after the sequence
        k = min(lookahead, room, max_new_tokens - len(out) - 1)
        drafts, qs = drafter.propose(ids, k, sampling, generator) if k > 0 else ([], None)
        seq = torch.cat([ids, ids.new_tensor([drafts])], dim=1) if drafts else ids
        logits = model.logits(seq, start)[0, -(len(drafts) + 1) :]  # (len + 1, V)
        p = sampling_probs(logits, *sampling)  # (len + 1, V)
        emitted: list[int] = []
        for i, token in enumerate(drafts):
            ok, token = _accept(p[i], None if qs is None else qs[i], token, generator, greedy)
            emitted.append(token)
            if not ok:
                break
        else:  # every draft accepted: the bonus token from the target's last distribution
            if greedy:
                emitted.append(int(p[-1].argmax()))
            else:
                emitted.append(int(torch.multinomial(p[-1], 1, generator=generator)))
        stats.rounds += 1
        stats.proposed += len(drafts)
        stats.accepted += len(emitted) - 1
        ids = torch.cat([ids, ids.new_tensor([emitted])], dim=1)  # (1, n + accepted + 1)
        model.rollback(ids.shape[1] - 1)  # the last emitted token is not in the caches yet
        drafter.rollback(ids.shape[1] - 1)
        for token in emitted:
            out.append(token)
            stats.emitted += 1
            if on_token is not None and on_token(token):
                return out, stats
    return out, stats
