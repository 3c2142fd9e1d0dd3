"""Tiny run folders of every kind, written directly (random weights, seconds, no training).

The config comes from the task layer (``training.build_config``: the task's preset with tiny
overrides, ``folder.write_config``) and each folder holds the files the task's ``load`` reads,
so ``load_run`` loads it exactly as it loads a trained run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.runs import folder
from attnlab.runs.training import build_config
from attnlab.train import save_weights

TEXTS = ["好看极了精彩感人", "剧情拖沓很失望", "演技很棒情节紧凑", "无聊透顶浪费时间"]


def _write(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")


def _folder(root: Path, name: str, task: str, overrides: dict[str, Any]):
    run = root / name
    run.mkdir(parents=True)
    cfg = build_config(task, None, overrides)
    return run, cfg


def _save(run: Path, cfg, model: torch.nn.Module) -> Path:
    folder.write_config(run, cfg.to_json())
    save_weights(model, run / "model.safetensors")
    return run


def classifier_run(root: Path, max_len: int = 64, **model: object) -> Path:
    from attnlab.data import CharTokenizer, LabelVocab
    from attnlab.models.classifier import build_classifier

    tok = CharTokenizer.build(TEXTS, min_freq=1)
    fields = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, context=max_len, pooling="cls")
    fields |= dict(bigram_buckets=0, ngram_buckets=0, vocab_size=tok.vocab_size, min_freq=1)
    run, cfg = _folder(root, "classify", "classify", {"arch": "char", **fields, **model})
    tok.save(run / "tokenizer.json")
    LabelVocab.build(["positive", "negative"]).save(run / "labels.json")
    _write(run / "data_report.json", {"max_len": max_len})
    torch.manual_seed(0)
    return _save(run, cfg, build_classifier(cfg.model))


def gpt_run(root: Path, **model: object) -> Path:
    from attnlab.data.lm_tokenizer import CharLMTokenizer, save_tokenizer
    from attnlab.models.gpt import GPT

    tok = CharLMTokenizer.build(["To be, or not to be: that is the question.\n"])
    fields = dict(context=64, n_layers=2, n_heads=2, d_model=16, pos="learned")
    run, cfg = _folder(root, "lm", "lm", {**fields, "vocab_size": tok.vocab_size, **model})
    save_tokenizer(tok, run / "tokenizer.json")
    torch.manual_seed(0)
    return _save(run, cfg, GPT(cfg.model))


def translate_run(root: Path) -> Path:
    from attnlab.data.parallel import TextTokenizer
    from attnlab.models.seq2seq import Seq2SeqTransformer

    texts = ["the cat sat on the mat", "die katze sass auf der matte"]
    tok = TextTokenizer.train(texts, "char", 60)
    fields = dict(d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=32)
    fields |= dict(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, context=128)
    fields |= dict(beam_size=2, max_len_a=1.0, max_len_b=4)
    run, cfg = _folder(root, "translate", "translate", fields)
    tok.save(run / "tokenizer.json")
    torch.manual_seed(0)
    return _save(run, cfg, Seq2SeqTransformer(cfg.model))


def vision_run(root: Path, arch: str, **model: object) -> Path:
    from attnlab.tasks.vision import build_model

    if arch == "vit":
        fields = dict(image_size=28, patch_size=7, d_model=16, n_layers=2, n_heads=2, d_ff=32)
        fields |= dict(stem="patch")
    else:
        fields = dict(width=8, stages=2, blocks_per_stage=1)
    overrides = {**fields, "in_channels": 1, "n_classes": 10, **model, "arch": arch}
    run, cfg = _folder(root, arch, "vision", overrides)
    classes = [f"class {k}" for k in range(10)]
    report = {"classes": classes, "image_shape": [1, 28, 28], "mean": [0.3], "std": [0.35]}
    _write(run / "data_report.json", report)
    torch.manual_seed(0)
    return _save(run, cfg, build_model(cfg))


def bert_classifier_run(root: Path) -> Path:
    """A fine-tuned-BERT run folder: MiniLM's WordPiece vocabulary, a tiny random encoder."""
    from attnlab.data import LabelVocab
    from attnlab.data.wordpiece import WordPieceTokenizer
    from attnlab.models.bert import BertClassifier, BertConfig
    from attnlab.models.minilm import folder as minilm_folder

    tok = WordPieceTokenizer.from_dir(minilm_folder())
    run, cfg = _folder(root, "bert_classify", "classify", {"arch": "minilm", "pooling": "cls"})
    # the model section is derived from the checkpoint in training: here a tiny one
    cfg.sections["model"] = BertConfig(
        vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32
    )
    tok.save(run / "tokenizer.json")
    LabelVocab.build(["positive", "negative"]).save(run / "labels.json")
    _write(run / "data_report.json", {"max_len": 32})
    torch.manual_seed(0)
    return _save(run, cfg, BertClassifier(cfg.model, 2, "cls"))


def image_file(root: Path, name: str = "shirt.png") -> Path:
    """A 28×28 grey test image (a bright square on a dark ground)."""
    from PIL import Image

    pixels = np.zeros((28, 28), dtype=np.uint8)
    pixels[6:22, 8:20] = 200
    pixels[10:14, 3:25] = 140
    path = root / name
    Image.fromarray(pixels, mode="L").save(path)
    return path
