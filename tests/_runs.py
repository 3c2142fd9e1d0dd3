"""Tiny fine-tuned-encoder classifier run folders, written directly (random weights, no
training): the API, server and export tests share them.

``e5_run`` has multilingual-e5's layout (its real 250k-piece SentencePiece tokenizer with the
"query: " prefix, a 4-bit packed word table, XLM-R's position offset of 2, pad id 1) around a
random 2-layer encoder of width 32; ``bert_run`` MiniLM's WordPiece vocabulary around a random
BERT. The config comes from the task layer (``training.build_config``) and the folder holds
the files the task's ``load`` reads, so ``load_run`` loads it as it loads a trained run.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from attnlab.data import LabelVocab
from attnlab.models.bert import BertClassifier, BertConfig
from attnlab.runs import folder
from attnlab.runs.training import build_config
from attnlab.train import save_weights

LABELS = ["negative", "positive"]


def _randomize_words(model: BertClassifier, generator: torch.Generator) -> None:
    """Random 4-bit codes and scales: a packed table starts as zeros."""
    word = model.bert.embeddings.word
    word.codes.copy_(torch.randint(0, 256, word.codes.shape, generator=generator))
    scales = torch.rand(word.scales.shape, generator=generator) * 0.05 + 0.01
    word.scales.copy_(scales.half())


def write_run(
    out: Path, arch: str, tokenizer, cfg_model: BertConfig, max_len: int, pooling: str,
    seed: int, prune: list[list[int]] | None = None,
) -> Path:  # fmt: skip
    """``prune``: heads to cut out of each layer, as ``attnlab prune`` saves a run."""
    out.mkdir(parents=True)
    cfg = build_config("classify", None, {"arch": arch, "pooling": pooling})
    cfg.sections["model"] = cfg_model
    tokenizer.save(out / "tokenizer.json")
    LabelVocab.build(LABELS).save(out / "labels.json")
    report = {"max_len": max_len, "checkpoint": "a random tiny encoder", "source": "tests"}
    (out / "data_report.json").write_text(json.dumps(report), encoding="utf-8")
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = BertClassifier(cfg_model, len(LABELS), pooling).eval()
    if cfg_model.packed_words:
        _randomize_words(model, generator)
    with torch.no_grad():  # positions that matter, a head that separates the classes a little
        model.bert.embeddings.position.embedding.weight.mul_(20)
        model.head.weight.mul_(20)
    if prune is not None:
        from attnlab.compress.heads import prune_heads

        cfg_model.heads_per_layer = tuple(prune_heads(model, prune))
        (out / folder.PRUNED).write_text(json.dumps({"removed": prune}), encoding="utf-8")
    folder.write_config(out, cfg.to_json())
    save_weights(model, out / folder.WEIGHTS)
    return out


def e5_run(
    out: Path, pooling: str = "mean", max_len: int = 64, seed: int = 0,
    prune: list[list[int]] | None = None, n_heads: int = 2,
) -> Path:  # fmt: skip
    from attnlab.data.sentencepiece import SentencePieceTokenizer
    from attnlab.models.e5 import PREFIXES, tokenizer_path

    tokenizer = SentencePieceTokenizer.load(tokenizer_path(), prefix=PREFIXES["query"])
    cfg = BertConfig(vocab_size=250037, d_model=32, n_layers=2, n_heads=n_heads, d_ff=64,
                     context=512, pad_id=1, position_offset=2, packed_words=True,
                     dropout=0.0, attn_dropout=0.0)  # fmt: skip
    return write_run(out, "e5", tokenizer, cfg, max_len, pooling, seed, prune)


def bert_run(out: Path, pooling: str = "cls", max_len: int = 32, seed: int = 0) -> Path:
    from attnlab.data.wordpiece import WordPieceTokenizer
    from attnlab.models.minilm import folder as minilm_folder

    tokenizer = WordPieceTokenizer.from_dir(minilm_folder())
    cfg = BertConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_layers=2, n_heads=2,
                     d_ff=64, context=512, dropout=0.0, attn_dropout=0.0)  # fmt: skip
    return write_run(out, "minilm", tokenizer, cfg, max_len, pooling, seed)
