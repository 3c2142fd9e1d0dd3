"""attnlab's BERT -> Hugging Face BERT checkpoint folders (``BertForMaskedLM`` tensors).

``save_pretrained`` writes ``config.json``, ``model.safetensors`` and ``tokenizer.json``, the
folder that `attnlab train mlm` leaves in its run's ``checkpoint/`` and that ``transformers``
and :mod:`attnlab.models.bert_folder` (the reading side) load.
"""

from __future__ import annotations

import json
from pathlib import Path

from torch import Tensor

from attnlab.data.wordpiece import WordPieceTokenizer
from attnlab.models.bert import (
    MLM_NAMES,
    POOLER_NAMES,
    BertMLMHead,
    BertModel,
    encoder_names,
)
from attnlab.tensor_files import save_safetensors


def hf_state(model: BertModel, mlm: BertMLMHead | None = None) -> dict[str, Tensor]:
    """The Hugging Face ``BertForMaskedLM``-style tensors of ``model`` (and its MLM head)."""
    out: dict[str, Tensor] = {}
    groups = [(model, encoder_names(model.cfg) | POOLER_NAMES, "bert.")]
    if mlm is not None:
        groups.append((mlm, MLM_NAMES, ""))
    for module, names, prefix in groups:
        state = module.state_dict()
        for ours, theirs in names.items():
            for name, part in zip(theirs, state[ours].chunk(len(theirs), dim=0)):
                out[prefix + name] = part.detach().clone().contiguous()
    if mlm is not None:
        out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"].clone()
    return out


def save_pretrained(
    path: str | Path, model: BertModel, tokenizer: WordPieceTokenizer, mlm: BertMLMHead | None
) -> Path:
    """Write a Hugging Face BERT directory (config.json, model.safetensors, tokenizer.json)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.cfg.to_hf(), indent=2) + "\n")
    state = hf_state(model, mlm)
    if mlm is not None:  # the tied decoder, stored as its own copy (safetensors shares nothing)
        word = state["bert.embeddings.word_embeddings.weight"]
        state["cls.predictions.decoder.weight"] = word.clone()
    save_safetensors(state, path / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save(path / "tokenizer.json")
    return path
