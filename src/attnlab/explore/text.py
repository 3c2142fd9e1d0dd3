"""Page data of text encoders: the character classifier and BERT (fine-tuned or MiniLM).

Every input is one row of one padded batch, as ``attnlab predict`` runs them, so several inputs
show the padding mask at work. Per input: the tokens (padding included), the self-attention of
every layer, the prediction, and each token's share of the pooled vector (attention rollout);
for a fine-tuned pretrained encoder also which of the text's own pieces moved the decision
(integrated gradients, infer.attribution).
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.data import pad_batch
from attnlab.data.io import is_blank
from attnlab.errors import UserError
from attnlab.explore.pack import build_group, calls_named, rollout
from attnlab.explore.sources import Source
from attnlab.infer.attribution import explains, piece_attribution, prompt_prefix
from attnlab.infer.describe import encoder_name, prefix_note
from attnlab.layers.attention_record import record_attention
from attnlab.models.classifier import TextClassifierEnsemble


def check_texts(texts: list[str], max_chars: int) -> None:
    """Refuse empty or oversized inputs with a message that says what to change."""
    if not texts:
        raise UserError("no input given: pass one or more texts after the run")
    for i, text in enumerate(texts):
        if is_blank(text):
            raise UserError(f"input {i + 1} is empty; give some text to look inside")
        if len(text) > max_chars:
            raise UserError(
                f"input {i + 1} has {len(text)} characters, over the limit of {max_chars}; "
                "shorten it (the model truncates long inputs anyway)"
            )


@torch.no_grad()
def classifier_examples(source: Source, texts: list[str], member: int = 0) -> dict[str, Any]:
    """The character-level classifier: attention of one model (one member of an ensemble)."""
    run = source.run
    ids, lengths = run.encode(texts)  # (B, T), (B,)
    model = run.model
    if isinstance(model, TextClassifierEnsemble):
        if not 0 <= member < len(model.members):
            raise UserError(f"--member must be in 1..{len(model.members)}, got {member + 1}")
        model = model.members[member]
    elif member != 0:
        raise UserError("--member: this run is a single model, not an ensemble")
    with record_attention(model) as rec:
        info = model.inspect(ids, lengths)  # the classifier's own rollout (token_share)
    calls = calls_named(rec.calls, "self_attn")
    preds = run.predict(texts)
    examples = []
    for b, text in enumerate(texts):
        tokens = run.reader.tokens(text)
        group = build_group("self-attention", calls, b, tokens, tokens)
        n = int(lengths[b])
        examples.append(
            {
                "input": text,
                "groups": [group],
                "prediction": _prediction(preds[b]),
                "token_share": info["token_share"][b, :n].tolist(),
                "share_note": _share_note(run.config.model.pooling),
            }
        )
    cfg = run.config.model
    title = f"classifier · {cfg.n_layers} layers × {cfg.n_heads} heads · d_model {cfg.d_model}"
    if cfg.members > 1:
        title += f" · attention of member {member + 1} of {cfg.members}"
    return {"title": title, "examples": examples}


@torch.no_grad()
def bert_examples(source: Source, texts: list[str]) -> dict[str, Any]:
    """BERT: a fine-tuned classifier run (with its prediction) or a sentence encoder."""
    run = source.run
    bert = getattr(run.model, "bert", run.model)  # BertClassifier.bert, or the BertModel itself
    seqs = run.tokenizer.encode_batch(texts, run.max_len)
    ids, lengths = pad_batch(seqs, run.tokenizer.pad_id)  # (B, T), (B,)
    with record_attention(bert) as rec:
        bert(ids, lengths)
    calls = calls_named(rec.calls, "attn")  # self_attn; DeBERTa's attn
    pooling = getattr(run.model, "pooling", "mean")
    preds = run.predict(texts) if hasattr(run, "predict") else None
    explain = preds is not None and explains(run.model)
    vectors = None if preds is not None else run.encode(texts)  # (B, D) unit sentence vectors
    examples = []
    for b, text in enumerate(texts):
        n = int(lengths[b])
        tokens = run.tokenizer.tokens(text, run.max_len)
        group = build_group("self-attention", calls, b, tokens, tokens)
        weights = torch.stack([c.weights[b, :, :n, :n] for c in calls])  # (L, H, n, n)
        r = rollout(weights)  # (n, n)
        share = r[0] if pooling == "cls" else r.mean(dim=0)  # (n,)
        example: dict[str, Any] = {
            "input": text,
            "groups": [group],
            "token_share": (share / share.sum()).tolist(),
            "share_note": _share_note(pooling),
        }
        if preds is not None:
            example["prediction"] = _prediction(preds[b])
        if explain:
            example["attribution"] = piece_attribution(run, text)
        elif vectors is not None and len(texts) > 1:
            sims = (vectors @ vectors[b]).tolist()
            example["similarity"] = [
                {"text": t, "cosine": round(s, 4)}
                for j, (t, s) in enumerate(zip(texts, sims))
                if j != b
            ]
        examples.append(example)
    cfg = bert.cfg
    if preds is not None:
        name = encoder_name(run, "BERT")
        model = f"{name}, fine-tuned (run {source.name})"
    else:
        name = source.name
        model = f"{name} (pretrained, not fine-tuned)"
    title = f"{model} · {cfg.n_layers} layers × {cfg.n_heads} heads · d {cfg.d_model}"
    data: dict[str, Any] = {"title": title, "examples": examples}
    prefix = prompt_prefix(run.tokenizer)
    if prefix:
        data["subtitle"] = prefix_note(name, prefix)
    return data




def _prediction(pred: dict[str, Any]) -> dict[str, Any]:
    """Label, probabilities and the input's reach (share of <unk> tokens, flag, warning)."""
    keep = ("label", "probs", "unknown_share", "out_of_reach", "warning")
    return {k: pred[k] for k in keep if k in pred}


def _share_note(pooling: str) -> str:
    read = "the <cls> row" if pooling == "cls" else "the mean of the real tokens' rows"
    return (
        "each token's share of the pooled vector: attention rollout (Abnar & Zuidema 2020), "
        f"(A + I)/2 multiplied over layers, read at {read}"
    )
