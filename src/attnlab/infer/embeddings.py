"""Sentence embeddings from a pretrained encoder: embed, similarity and semantic search.

The encoder comes through the one door (:func:`attnlab.runs.encoders.open_encoder`): ``e5``
(multilingual-e5-small, the default: it reads Chinese and ~100 other languages), ``minilm``
(English), a checkpoint folder or an `attnlab train mlm` run. An encoder trained with input
prefixes reads ``"query: "`` before a query or a text to compare and ``"passage: "`` before a
document to be found; search encodes the documents as passages.

A sentence vector is the mean of its real tokens' final hidden states, L2-normalised (as
sentence-transformers computes for all-MiniLM-L6-v2), so the dot product of two vectors is their
cosine similarity. Inputs are truncated to what the encoder reads (sentence-transformers'
``max_seq_length``, 256 for MiniLM, or else its number of positions).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.data import pad_batch
from attnlab.data.io import read_utf8
from attnlab.errors import UserError
from attnlab.models.bert import mean_pool
from attnlab.runs.encoders import open_encoder

DEFAULT_ENCODER = "e5"  # multilingual: the main job's texts are Chinese


@dataclass
class SentenceEncoder:
    """An encoder and its tokenizer, turning texts into unit-length vectors (N, D)."""

    model: Any  # BERT-shaped: ids (B, T), lengths (B,) -> hidden (B, T, D)
    tokenizer: Any
    max_len: int
    passages: Any = None  # the tokenizer of documents to be found, when it differs

    @classmethod
    def load(cls, spec: str | Path = DEFAULT_ENCODER, role: str | None = None) -> SentenceEncoder:
        """The encoder ``spec`` names (see :func:`~attnlab.runs.encoders.open_encoder`), in eval
        mode on the CPU, its texts read as ``role`` ("query" by default; "passage" for texts to
        be found) where the encoder was trained with prefixes."""
        encoder = open_encoder(spec, role or "query")
        if role is not None and not encoder.prefixes:
            raise UserError(
                f"--role applies to encoders trained with input prefixes (e5); {spec} reads "
                "every text as it is: drop --role"
            )
        passages = encoder.tokenizer_for("passage") if encoder.prefixes else None
        return cls(encoder.model.eval(), encoder.tokenizer, encoder.max_len, passages)

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 32, tokenizer=None) -> Tensor:
        """Unit-length sentence vectors (N, D), in the order of ``texts`` (``tokenizer``: one
        other than the encoder's own, e.g. e5's passage tokenizer)."""
        tokenizer = tokenizer or self.tokenizer
        if not texts:
            raise UserError("no texts to embed; give at least one sentence")
        if batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {batch_size}")
        seqs = tokenizer.encode_batch(texts, self.max_len)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # little padding per batch
        out = torch.empty(len(texts), self.model.cfg.d_model)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            ids, lengths = pad_batch([seqs[i] for i in rows], tokenizer.pad_id)
            pooled = mean_pool(self.model(ids, lengths), lengths)  # (b, D)
            out[rows] = torch.nn.functional.normalize(pooled, dim=-1)
        return out


def similarity(encoder: SentenceEncoder, a: str, b: str) -> float:
    """Cosine similarity of two texts' sentence vectors, in [-1, 1]."""
    vectors = encoder.encode([a, b])
    return float(vectors[0] @ vectors[1])


def read_lines(path: str | Path) -> list[str]:
    """The non-empty lines of a UTF-8 text file (stripped), for search."""
    lines = [line.strip() for line in read_utf8(path).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        raise UserError(f"{path} has no non-empty lines to search")
    return lines


def search(
    encoder: SentenceEncoder, documents: list[str], queries: list[str], k: int = 5
) -> list[list[tuple[int, float]]]:
    """For each query, the top ``k`` (document index, cosine) pairs, best first."""
    if k < 1:
        raise UserError(f"k must be >= 1, got {k}")
    docs = encoder.encode(documents, tokenizer=encoder.passages)  # (N, D)
    scores = encoder.encode(queries) @ docs.T  # (Q, N)
    top = scores.topk(min(k, len(documents)), dim=-1)
    return [list(zip(idx.tolist(), val.tolist())) for idx, val in zip(top.indices, top.values)]


def write_vectors(vectors: Tensor, texts: list[str], out: str | Path | None) -> str | None:
    """Save vectors as ``.npy`` (N, D) float32 or ``.json``; with no path return JSON lines."""
    records = [{"text": t, "vector": v} for t, v in zip(texts, vectors.tolist())]
    if out is None:
        return "\n".join(json.dumps(r, ensure_ascii=False) for r in records)
    out = Path(out)
    if out.suffix == ".npy":
        np.save(out, vectors.numpy().astype(np.float32))
    elif out.suffix == ".json":
        out.write_text(json.dumps(records, ensure_ascii=False) + "\n", encoding="utf-8")
    else:
        raise UserError(f"--out must end in .npy or .json, got {out.name}")
    return None
