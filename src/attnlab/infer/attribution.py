"""Which of a text's own pieces moved a fine-tuned encoder's decision: integrated gradients.

Attention rollout (explore.pack.rollout) says where attention flows; for e5 most of it flows to
``<s>`` and ``</s>``, which every input has, so it cannot say which words decided. This module
attributes the decision itself to the input pieces:

- the score explained is the log-odds of the predicted class k, f = z_k − log Σ_{j≠k} exp z_j
  (for two classes the logit difference);
- the input is the word vectors e (T, D) the encoder reads (positions, segment, LayerNorm and
  the blocks are applied as the model applies them), the reference e' the same sequence with
  each text piece's vector replaced by the ``<pad>`` piece's; ``<s>``, ``</s>`` and the prompt
  prefix (e5's ``query: ``) stay, so they take no score: every input has them;
- integrated gradients (Sundararajan et al. 2017, eq. 1):
  IG_t = Σ_d (e − e')_{t,d} ∫_0^1 ∂f(e' + α(e − e'))/∂e_{t,d} dα, the integral by Gauss–Legendre
  quadrature; completeness (their Proposition 1): Σ_t IG_t = f(e) − f(e'), reported as ``gap``;
- gradient × (input − reference), the one-gradient alternative: Σ_d (e − e')_{t,d} ∂f(e)/∂e_{t,d}.

Nothing here changes the model or registers hooks on it: the forward pass from word vectors is
computed here from the model's own submodules, so a server may explain while its model thread
predicts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.models.bert import BertClassifier, BertModel, mean_pool

METHODS = ("ig", "gxi")
STEPS = 32  # Gauss–Legendre nodes of the path integral
TOKENS_PER_PASS = 4096  # path points × pieces in one forward/backward pass (bounds memory)


def prompt_prefix(tokenizer: Any) -> str:
    """The text a tokenizer writes before every input (e5's ``"query: "``), or ``""``: read from
    the tokenizer's own normaliser, where attnlab's SentencePiece loader puts it."""
    steps = _normalizers(tokenizer)
    return next((getattr(n, "prepend", "") for n in steps if type(n).__name__ == "Prepend"), "")


def _normalizers(tokenizer: Any) -> list[Any]:
    tok = getattr(tokenizer, "_tok", None)  # the tokenizers.Tokenizer a PieceTokenizer wraps
    norm = getattr(tok, "normalizer", None)
    if norm is None:
        return []
    try:
        return list(norm)  # a Sequence of normalisers
    except TypeError:
        return [norm]


def text_pieces(tokenizer: Any, text: str, n_ids: int) -> tuple[int, int]:
    """(start, stop): the positions of ``text``'s own pieces among its ``n_ids`` encoded ids
    (``<s>``, prefix pieces, text pieces, ``</s>``; truncation cuts text pieces). The prefix's
    pieces are those the encoding has beyond the text read without the prefix (a tokenizer
    sharing the same vocabulary model, without the Prepend step)."""
    from tokenizers import Tokenizer, normalizers

    tok = getattr(tokenizer, "_tok", None)
    prefix = prompt_prefix(tokenizer)
    n_prefix = 0
    if prefix and tok is not None:
        plain = Tokenizer(tok.model)  # shares the vocabulary: no copy of its 250k pieces
        rest = [n for n in _normalizers(tokenizer) if type(n).__name__ != "Prepend"]
        plain.normalizer = normalizers.Sequence(rest)
        plain.pre_tokenizer = tok.pre_tokenizer
        with_prefix = tok.encode(text, add_special_tokens=False).ids
        alone = plain.encode(text, add_special_tokens=False).ids
        n_prefix = len(with_prefix) - len(alone)
        if n_prefix < 0 or with_prefix[n_prefix:] != alone:  # the prefix merged into the text
            n_prefix = _common_head(with_prefix, plain.encode(prefix).ids)
    start = 1 + n_prefix  # after <s> / [CLS]
    return min(start, n_ids - 1), n_ids - 1  # before </s> / [SEP]


def _common_head(ids: list[int], prefix_ids: list[int]) -> int:
    n = 0
    while n < min(len(ids), len(prefix_ids)) and ids[n] == prefix_ids[n]:
        n += 1
    return n


def explains(model: Any) -> bool:
    """Whether :func:`attribute` reads ``model``: a classifier over BERT's own encoder (e5,
    MiniLM, a BERT folder), whose embeddings it recomposes; ALBERT's and DeBERTa's differ."""
    return isinstance(model, BertClassifier) and isinstance(model.bert, BertModel)


def embed_words(model: BertClassifier, ids: Tensor, words: Tensor) -> Tensor:
    """BertEmbeddings.forward with the word vectors given: ids (B, T), words (B, T, D) ->
    LayerNorm(words + position + segment 0) (B, T, D)."""
    emb = model.bert.embeddings
    if emb.skip_pad:  # XLM-R: positions count the non-pad ids
        real = ids != emb.pad_id  # (B, T)
        index = (real.cumsum(1) - 1).clamp(min=0)  # (B, T)
        x = words + emb.position.embedding(index) * real.unsqueeze(-1)  # (B, T, D)
    else:
        x = emb.position(words)  # (B, T, D)
    x = x + emb.token_type(torch.zeros_like(ids))
    return emb.dropout(emb.norm(x))


def logits_from_words(model: BertClassifier, ids: Tensor, words: Tensor) -> Tensor:
    """Class logits (B, C) of one unpadded text's ids (B, T) read with word vectors (B, T, D)."""
    hidden = model.bert.encoder(embed_words(model, ids, words), None)  # (B, T, D)
    if model.pooling == "cls":
        pooled = model.bert.pool(hidden)  # (B, D)
    else:
        lengths = torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long, device=ids.device)
        pooled = mean_pool(hidden, lengths)  # (B, D)
    return model.head(model.dropout(pooled))  # (B, C)


def log_odds(logits: Tensor, k: int) -> Tensor:
    """f = z_k − log Σ_{j≠k} exp z_j = log p_k − log(1 − p_k): (B, C) -> (B,)."""
    others = torch.cat([logits[:, :k], logits[:, k + 1 :]], dim=1)  # (B, C-1)
    return logits[:, k] - torch.logsumexp(others, dim=1)


def word_vectors(model: BertClassifier, ids: Tensor) -> Tensor:
    """The word vectors (1, T, D) the model reads for ids (1, T), in the model's dtype."""
    dtype = model.head.weight.dtype
    return model.bert.embeddings.word(ids).to(dtype)  # a packed table unpacks to float32


def reference_vectors(model: BertClassifier, ids: Tensor, span: tuple[int, int]) -> Tensor:
    """The reference (1, T, D): the text pieces' vectors replaced by the ``<pad>`` piece's."""
    ref_ids = ids.clone()
    ref_ids[:, span[0] : span[1]] = model.bert.embeddings.pad_id
    return word_vectors(model, ref_ids)


def gauss_legendre(steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights of Gauss–Legendre quadrature on [0, 1]."""
    x, w = np.polynomial.legendre.leggauss(steps)
    return (x + 1) / 2, w / 2


def path_gradients(
    model: BertClassifier, ids: Tensor, x: Tensor, ref: Tensor, alphas: np.ndarray, k: int
) -> Tensor:
    """∂f/∂e at e' + α(e − e') for every α: (S, T, D), in chunks of at most TOKENS_PER_PASS."""
    T = ids.shape[1]
    per_pass = max(1, TOKENS_PER_PASS // T)
    grads = []
    for lo in range(0, len(alphas), per_pass):
        a = torch.as_tensor(alphas[lo : lo + per_pass], dtype=x.dtype, device=x.device)
        points = (ref + a[:, None, None] * (x - ref)).detach().requires_grad_(True)  # (s, T, D)
        f = log_odds(logits_from_words(model, ids.expand(len(a), T), points), k)  # (s,)
        grads.append(torch.autograd.grad(f.sum(), points)[0])  # (s, T, D)
    return torch.cat(grads)


def attribute(
    model: BertClassifier, ids: Tensor, span: tuple[int, int], method: str = "ig",
    steps: int = STEPS, target: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Scores (T,) of one text's ids (1, T) for the log-odds of ``target`` (default: the
    predicted class); positions outside ``span`` (the specials and the prefix) score 0.

    Returns ``scores``, ``target``, ``probs`` (C,), ``log_odds`` f(e), ``reference_log_odds``
    f(e'), ``reference_probs`` and ``gap`` = Σ scores − (f(e) − f(e')) (integrated gradients
    tend to 0 with more steps; gradient × input has no such guarantee)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"ids must be (1, T), got {tuple(ids.shape)}")
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            x = word_vectors(model, ids).detach()  # (1, T, D)
            ref = reference_vectors(model, ids, span).detach()  # (1, T, D)
            with torch.no_grad():
                both = logits_from_words(model, ids.expand(2, -1), torch.cat([x, ref]))  # (2, C)
            k = int(both[0].argmax()) if target is None else target
            f = log_odds(both, k)  # (2,)
            if method == "ig":
                alphas, weights = gauss_legendre(steps)
                grads = path_gradients(model, ids, x, ref, alphas, k)  # (S, T, D)
                w = torch.as_tensor(weights, dtype=x.dtype)
                mean_grad = (grads * w[:, None, None]).sum(0)  # (T, D): ∫ ∂f/∂e dα
            else:
                mean_grad = path_gradients(model, ids, x, ref, np.ones(1), k)[0]  # (T, D)
            scores = ((x[0] - ref[0]) * mean_grad).sum(-1)  # (T,)
    finally:
        model.train(was_training)
    probs = torch.softmax(both.double(), dim=-1)  # (2, C)
    return {
        "scores": scores.detach(),
        "target": k,
        "probs": probs[0].tolist(),
        "reference_probs": probs[1].tolist(),
        "log_odds": float(f[0]),
        "reference_log_odds": float(f[1]),
        "gap": float(scores.sum()) - float(f[0] - f[1]),
    }


def piece_attribution(run: Any, text: str, method: str = "ig") -> dict[str, Any]:
    """Integrated gradients (above) of one text for a fine-tuned encoder's
    prediction: every piece with its role (special, prefix, text) and score."""
    ids = torch.tensor([run.reader.encode_batch([text])[0]])  # (1, T)
    tokens = run.tokenizer.tokens(text, run.max_len)
    start, stop = text_pieces(run.tokenizer, text, len(tokens))
    out = attribute(run.model, ids, (start, stop), method)
    roles = ["special"] + ["prefix"] * (start - 1) + ["text"] * (stop - start) + ["special"]
    k = out["target"]
    how = f"integrated gradients, {STEPS} steps" if method == "ig" else "gradient × input"
    return {
        "method": how,
        "label": run.labels.labels[k],
        "tokens": tokens,
        "roles": roles,
        "scores": [round(float(v), 6) for v in out["scores"]],
        "log_odds": out["log_odds"],
        "reference_log_odds": out["reference_log_odds"],
        "reference_prob": out["reference_probs"][k],
        "gap": out["gap"],
        "note": ATTRIBUTION_NOTE,
    }


ATTRIBUTION_NOTE = (
    "Each piece's score is its share of the change in the predicted label's log-odds, "
    "log p/(1−p), between the text and a reference where every piece of the text is <pad> "
    "(integrated gradients over the word vectors, Sundararajan et al. 2017): positive pushed "
    "towards the label, negative against; the scores add up to that change."
)
