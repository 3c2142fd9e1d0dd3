"""Tiny run folders of every kind, written directly (random weights, seconds, no training).

Each folder holds what the task's own loader reads, so `load_source` loads it exactly as it
loads a trained run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from attnlab.train import TrainConfig, save_weights

TEXTS = ["好看极了精彩感人", "剧情拖沓很失望", "演技很棒情节紧凑", "无聊透顶浪费时间"]


def _write(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")


def classifier_run(root: Path, max_len: int = 64, **model: object) -> Path:
    from attnlab.data import CharTokenizer, LabelVocab
    from attnlab.models.classifier import ClassifierConfig, build_classifier
    from attnlab.tasks.classify import ClassifyConfig, RunConfig

    run = root / "classify"
    run.mkdir(parents=True)
    tok = CharTokenizer.build(TEXTS, min_freq=1)
    tok.save(run / "tokenizer.json")
    LabelVocab.build(["positive", "negative"]).save(run / "labels.json")
    defaults = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=max_len, pooling="cls")
    cfg = ClassifierConfig(vocab_size=tok.vocab_size, **{**defaults, **model})  # type: ignore[arg-type]
    data = ClassifyConfig(truncate_len=max_len, min_freq=1)
    _write(run / "config.json", RunConfig(data, cfg, TrainConfig()).to_json())
    _write(run / "data_report.json", {"max_len": max_len})
    torch.manual_seed(0)
    save_weights(build_classifier(cfg), run / "model.safetensors")
    return run


def gpt_run(root: Path, **model: object) -> Path:
    from attnlab.data.lm_tokenizer import CharLMTokenizer, save_tokenizer
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.tasks.lm import LMDataConfig, RunConfig

    run = root / "lm"
    run.mkdir(parents=True)
    tok = CharLMTokenizer.build(["To be, or not to be: that is the question.\n"])
    save_tokenizer(tok, run / "tokenizer.json")
    defaults = dict(context=64, n_layers=2, n_heads=2, d_model=16, pos="learned")
    cfg = GPTConfig(vocab_size=tok.vocab_size, **{**defaults, **model})  # type: ignore[arg-type]
    _write(run / "config.json", RunConfig(LMDataConfig(), cfg, TrainConfig()).to_json())
    torch.manual_seed(0)
    save_weights(GPT(cfg), run / "model.safetensors")
    return run


def translate_run(root: Path) -> Path:
    from attnlab.data.parallel import TextTokenizer
    from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
    from attnlab.tasks.translate import RunConfig, TranslateDataConfig

    run = root / "translate"
    run.mkdir(parents=True)
    tok = TextTokenizer.train(
        ["the cat sat on the mat", "die katze sass auf der matte"], "char", 60
    )
    tok.save(run / "tokenizer.json")
    cfg = Seq2SeqConfig(
        src_vocab_size=tok.vocab_size,
        tgt_vocab_size=tok.vocab_size,
        d_model=16,
        n_heads=2,
        n_encoder_layers=2,
        n_decoder_layers=2,
        d_ff=32,
        max_len=128,
    )
    data = TranslateDataConfig(beam_size=2, max_len_a=1.0, max_len_b=4)
    _write(run / "config.json", RunConfig(data, cfg, TrainConfig()).to_json())
    torch.manual_seed(0)
    save_weights(Seq2SeqTransformer(cfg), run / "model.safetensors")
    return run


def vision_run(root: Path, arch: str, **model: object) -> Path:
    from attnlab.models.cnn import CNNConfig
    from attnlab.models.vit import ViTConfig
    from attnlab.tasks.vision import RunConfig, VisionConfig, build_model

    run = root / arch
    run.mkdir(parents=True)
    if arch == "vit":
        defaults = dict(image_size=28, patch_size=7, d_model=16, n_layers=2, n_heads=2, d_ff=32)
        cfg: object = ViTConfig(**{**defaults, **model})  # type: ignore[arg-type]
    else:
        cfg = CNNConfig(**{**dict(width=8, stages=2, blocks_per_stage=1), **model})  # type: ignore[arg-type]
    config = RunConfig(arch, VisionConfig(), cfg, TrainConfig())  # type: ignore[arg-type]
    _write(run / "config.json", config.to_json())
    classes = [f"class {k}" for k in range(10)]
    report = {"classes": classes, "image_shape": [1, 28, 28], "mean": [0.3], "std": [0.35]}
    _write(run / "data_report.json", report)
    torch.manual_seed(0)
    model_ = build_model(config)
    save_weights(model_, run / "model.safetensors")
    return run


def image_file(root: Path, name: str = "shirt.png") -> Path:
    """A 28×28 grey test image (a bright square on a dark ground)."""
    from PIL import Image

    pixels = np.zeros((28, 28), dtype=np.uint8)
    pixels[6:22, 8:20] = 200
    pixels[10:14, 3:25] = 140
    path = root / name
    Image.fromarray(pixels, mode="L").save(path)
    return path


def bert_classifier_run(root: Path) -> Path:
    """A fine-tuned-BERT run folder: MiniLM's WordPiece vocabulary, a tiny random encoder."""
    from attnlab.configs import to_dict
    from attnlab.data import LabelVocab
    from attnlab.data.wordpiece import WordPieceTokenizer
    from attnlab.models.bert import BertClassifier, BertConfig
    from attnlab.models.bert_checkpoint import resolve_checkpoint
    from attnlab.tasks.bert_classify import BertClassifyConfig

    run = root / "bert_classify"
    run.mkdir(parents=True)
    tok = WordPieceTokenizer.from_dir(resolve_checkpoint("minilm"))
    tok.save(run / "tokenizer.json")
    LabelVocab.build(["positive", "negative"]).save(run / "labels.json")
    cfg = BertConfig(vocab_size=tok.vocab_size, d_model=16, n_layers=2, n_heads=2, d_ff=32)
    data = BertClassifyConfig(pooling="cls")
    config = {"task": "bert_classify", "data": to_dict(data), "train": to_dict(TrainConfig())}
    _write(run / "config.json", {**config, "model": to_dict(cfg), "n_classes": 2})
    _write(run / "data_report.json", {"max_len": 32})
    torch.manual_seed(0)
    save_weights(BertClassifier(cfg, 2, "cls"), run / "model.safetensors")
    return run
