"""Sentence embeddings from a BERT checkpoint: embed, similarity and semantic search.

multilingual-e5-small (``"e5"``) reads ``"query: "`` before a query or a text to compare and
``"passage: "`` before a document to be found; search encodes the documents as passages.

A sentence vector is the mean of its real tokens' final hidden states, L2-normalised (as
sentence-transformers computes for all-MiniLM-L6-v2), so the dot product of two vectors is their
cosine similarity. Inputs are truncated to the checkpoint's ``max_seq_length``
(``sentence_bert_config.json``; 256 for MiniLM) or else to its number of positions.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnlab.data import pad_batch
from attnlab.data.io import WRITE_REFUSALS, check_file_target, read_json, read_utf8
from attnlab.data.sentencepiece import SentencePieceTokenizer
from attnlab.data.wordpiece import WordPieceTokenizer
from attnlab.errors import UserError
from attnlab.interop.hf_bert import load_pretrained, resolve_checkpoint
from attnlab.models.bert import BertModel, mean_pool
from attnlab.models.e5 import NAME as E5
from attnlab.models.e5 import PREFIXES, load_e5, tokenizer_path
from attnlab.runs.load import load_run, recorded


@dataclass
class SentenceEncoder:
    """A BERT encoder and its tokenizer, turning texts into unit-length vectors (N, D)."""

    model: BertModel
    tokenizer: WordPieceTokenizer | SentencePieceTokenizer
    max_len: int
    passages: SentencePieceTokenizer | None = None  # e5: the "passage: " tokenizer, for search

    @classmethod
    def load(cls, checkpoint: str | Path = "minilm", role: str = "query") -> SentenceEncoder:
        """From a checkpoint directory, ``"minilm"`` or ``"e5"``, in eval mode on the CPU.

        e5 puts ``"query: "`` (``role="query"``: classification, similarity, search queries)
        or ``"passage: "`` (``role="passage"``: texts to be found) before each text, as its
        model card says; other checkpoints take no prefix.
        """
        if str(checkpoint) == E5:
            if role not in PREFIXES:
                raise UserError(f"role must be one of {sorted(PREFIXES)}, got {role!r}")
            model, tokenizer = load_e5(prefix=PREFIXES[role])
            passages = SentencePieceTokenizer.load(tokenizer_path(), prefix=PREFIXES["passage"])
            return cls(model.eval(), tokenizer, model.cfg.context, passages)
        kind = recorded(checkpoint)
        if kind is not None and kind[0] == "mlm" and kind[1] != "bert":
            return load_run(checkpoint).encoder  # type: ignore[attr-defined]  # ALBERT/DeBERTa
        path = resolve_checkpoint(checkpoint)
        model, _, tokenizer, _ = load_pretrained(path)
        max_len = model.cfg.context
        st_config = path / "sentence_bert_config.json"
        if st_config.is_file():
            keys = {"max_seq_length": int}
            raw = read_json(st_config, "sentence-transformers config", keys=keys)
            if raw["max_seq_length"] < 1:
                raise UserError(
                    f"{st_config}: max_seq_length must be >= 1, got {raw['max_seq_length']}; "
                    "restore the file"
                )
            max_len = min(max_len, raw["max_seq_length"])
        return cls(model.eval(), tokenizer, max_len)

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


VECTOR_FORMATS = (".npy", ".json")


def check_vectors_out(out: str | Path) -> Path:
    """``out`` as a path write_vectors can write, refused in one line before any work: a
    suffix it does not know, a folder in its place, a file where a folder above it must be, a
    folder that takes no new file (read-only, not permitted). A missing folder is made."""
    out = Path(out)
    if out.suffix not in VECTOR_FORMATS:
        raise UserError(f"--out must end in .npy or .json, got {out.name}")
    check_file_target(out, "--out")
    with _refusals(out):
        out.parent.mkdir(parents=True, exist_ok=True)
        _temporary(out).open("xb").close()  # a new file there, then gone
        _temporary(out).unlink()
    return out


def _temporary(out: Path) -> Path:
    return out.with_name(f".{out.name}.{os.getpid()}.tmp")


@contextlib.contextmanager
def _refusals(out: Path) -> Iterator[None]:
    """The file system's refusal to write ``out`` as one line naming it and --out."""
    try:
        yield
    except OSError as err:
        if err.errno not in WRITE_REFUSALS:
            raise
        raise UserError(
            f"cannot write --out {out} ({err.strerror}); give a file in a folder you can write to"
        ) from None


def write_vectors(vectors: Tensor, texts: list[str], out: str | Path | None) -> str | None:
    """Save vectors as ``.npy`` (N, D) float32 or ``.json`` (written whole or not at all);
    with no path return JSON lines."""
    records = [{"text": t, "vector": v} for t, v in zip(texts, vectors.tolist())]
    if out is None:
        return "\n".join(json.dumps(r, ensure_ascii=False) for r in records)
    out = check_vectors_out(out)
    tmp = _temporary(out)
    with _refusals(out):
        try:
            with tmp.open("xb") as handle:
                if out.suffix == ".npy":
                    np.save(handle, vectors.numpy().astype(np.float32))
                else:
                    handle.write((json.dumps(records, ensure_ascii=False) + "\n").encode())
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return None
