"""Greedy and batched beam-search decoding for Seq2SeqTransformer, with KV caches.

The decoder's self-attention keys/values grow one position per step (KVCache); the cross
attention projects the encoder output once (a static cache). A hypothesis may hold at most
``max_len_a · source_length + max_len_b`` tokens (EOS included).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlab.errors import UserError
from attnlab.models.seq2seq import Seq2SeqTransformer


@dataclass
class DecodeSettings:
    """Special ids and the length limit of decoding."""

    bos_id: int
    eos_id: int
    max_len_a: float = 1.5
    max_len_b: int = 10
    use_cache: bool = True


def max_lengths(src: Tensor, pad_id: int, settings: DecodeSettings) -> list[int]:
    """Per-sentence limit on generated tokens: ⌊a · |source| + b⌋, at least 1."""
    lengths = (src != pad_id).sum(dim=1).tolist()
    return [max(1, int(settings.max_len_a * n + settings.max_len_b)) for n in lengths]


class _Stepper:
    """Feeds the growing prefix to the decoder: the last token with caches, else all of it."""

    def __init__(
        self,
        model: Seq2SeqTransformer,
        memory: Tensor,
        src_mask: Tensor,
        settings: DecodeSettings,
    ) -> None:
        self.model, self.memory, self.src_mask = model, memory, src_mask
        self.caches = model.new_caches() if settings.use_cache else None
        self.banned = [model.cfg.pad_id, settings.bos_id]  # never generated

    def log_probs(self, prefix: Tensor) -> Tensor:
        """prefix (N, t) -> next-token log-probabilities (N, V); PAD and BOS set to -inf."""
        out = self._last(prefix).float().log_softmax(dim=-1)
        out[:, self.banned] = float("-inf")
        return out

    def _last(self, prefix: Tensor) -> Tensor:
        if self.caches is None:
            return self.model.decode(prefix, self.memory, self.src_mask)[:, -1]
        caches, cross = self.caches
        out = self.model.decode(
            prefix[:, -1:],
            self.memory,
            self.src_mask,
            offset=prefix.shape[1] - 1,
            caches=caches,
            cross_caches=cross,
        )  # (N, 1, V)
        return out[:, -1]

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` of the self caches (cross caches are equal within a source)."""
        if self.caches is not None:
            for cache in self.caches[0]:
                cache.reorder(index)


@torch.no_grad()
def greedy_decode(
    model: Seq2SeqTransformer, src: Tensor, settings: DecodeSettings
) -> list[list[int]]:
    """argmax at every step until EOS or the length limit; returns ids without BOS/EOS."""
    model.eval()
    memory, src_mask = model.encode(src)
    limits = max_lengths(src, model.cfg.pad_id, settings)
    B = src.shape[0]
    stepper = _Stepper(model, memory, src_mask, settings)
    prefix = torch.full((B, 1), settings.bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(B, dtype=torch.bool, device=src.device)
    out: list[list[int]] = [[] for _ in range(B)]
    for step in range(max(limits)):
        nxt = stepper.log_probs(prefix).argmax(dim=-1)  # (B,)
        for b, tok in enumerate(nxt.tolist()):
            if done[b]:
                continue
            if tok == settings.eos_id:
                done[b] = True
            else:
                out[b].append(tok)
                done[b] = step + 1 >= limits[b]
        if bool(done.all()):
            break
        prefix = torch.cat([prefix, nxt[:, None]], dim=1)  # (B, t + 1)
    return out


def length_penalty(length: int, alpha: float) -> float:
    """lp(Y) = ((5 + |Y|) / 6)^α  (Wu et al. 2016, eq. 14); scores are log P / lp."""
    return ((5.0 + length) / 6.0) ** alpha


@torch.no_grad()
def beam_search(
    model: Seq2SeqTransformer,
    src: Tensor,
    settings: DecodeSettings,
    beam_size: int = 4,
    alpha: float = 0.6,
    early_stopping: bool = True,
) -> list[list[int]]:
    """Batched beam search; the best finished hypothesis per source, without BOS/EOS.

    Each step keeps ``beam_size`` live beams per source from the top 2·beam_size extensions;
    an extension that ends in EOS (ranked within the top beam_size) becomes a finished
    hypothesis scored log P / lp. A source stops once it has beam_size finished hypotheses and
    either ``early_stopping`` is on or no live beam scores better (length-normalised at the
    current length), or at its length limit, where the live beams are finished as they are.
    """
    if beam_size < 1:
        raise UserError(f"beam_size must be >= 1, got {beam_size}")
    model.eval()
    K = beam_size
    memory, src_mask = model.encode(src)  # (B, S, D), (B, 1, 1, S)
    limits = max_lengths(src, model.cfg.pad_id, settings)
    B, device = src.shape[0], src.device
    stepper = _Stepper(
        model, memory.repeat_interleave(K, 0), src_mask.repeat_interleave(K, 0), settings
    )
    prefix = torch.full((B * K, 1), settings.bos_id, dtype=torch.long, device=device)
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start equal: keep one so the first step has no duplicates
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
    closed = [False] * B
    for step in range(max(limits)):
        logp = stepper.log_probs(prefix)  # (B·K, V)
        V = logp.shape[-1]
        cand = (scores.view(B * K, 1) + logp).view(B, K * V)
        top, idx = cand.topk(min(2 * K, K * V), dim=1)  # (B, 2K)
        rows = torch.zeros(B, K, dtype=torch.long)
        toks = torch.full((B, K), settings.eos_id, dtype=torch.long)
        new_scores = torch.full((B, K), float("-inf"))
        for b in range(B):
            if closed[b]:
                rows[b] = torch.arange(K)
                continue
            alive = 0
            for rank, (score, flat) in enumerate(zip(top[b].tolist(), idx[b].tolist())):
                beam, tok = divmod(flat, V)
                if score == float("-inf"):
                    break
                if tok == settings.eos_id:
                    if rank < K:
                        hyp = prefix[b * K + beam, 1:].tolist()
                        finished[b].append((score / length_penalty(step + 1, alpha), hyp))
                    continue
                rows[b, alive], toks[b, alive], new_scores[b, alive] = beam, tok, score
                alive += 1
                if alive == K:
                    break
            finished[b].sort(key=lambda h: -h[0])
            del finished[b][K:]
            if len(finished[b]) >= K:
                best_live = new_scores[b, 0].item() / length_penalty(step + 1, alpha)
                closed[b] = early_stopping or best_live <= finished[b][-1][0]
            if not closed[b] and step + 1 >= limits[b]:
                for k in range(alive):
                    hyp = prefix[b * K + int(rows[b, k]), 1:].tolist() + [int(toks[b, k])]
                    score = new_scores[b, k].item() / length_penalty(step + 1, alpha)
                    finished[b].append((score, hyp))
                finished[b].sort(key=lambda h: -h[0])
                closed[b] = True
        if all(closed):
            break
        index = (torch.arange(B)[:, None] * K + rows).view(-1).to(device)  # (B·K,)
        prefix = torch.cat([prefix[index], toks.view(-1, 1).to(device)], dim=1)
        stepper.reorder(index)
        scores = new_scores.to(device)
    return [max(f, key=lambda h: h[0])[1] if f else [] for f in finished]
