"""Hugging Face BERT and XLM-RoBERTa checkpoint folders, read into attnlab's BERT.

A checkpoint folder holds ``config.json`` (a Hugging Face BERT or XLM-R config),
``model.safetensors`` and ``tokenizer.json`` (or ``vocab.txt``, with ``tokenizer_config.json``
when it has one), as ``huggingface-cli download`` or ``save_pretrained`` leaves it:
bert-base-chinese, xlm-roberta-base, or a classifier that ``attnlab export --format hf`` wrote. A
``pytorch_model.bin`` without safetensors beside it is refused with the command that converts
it: nothing is unpickled from a file a user was handed. Tensor names may carry the ``bert.`` or
``roberta.`` prefix of the task models and the old ``gamma``/``beta`` LayerNorm names. A
checkpoint that does not fit raises one error listing the missing, unexpected and mis-shaped
tensors. Writing such folders is :mod:`attnlab.interop.hf_bert`'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.data.io import read_json
from attnlab.data.sentencepiece import load_tokenizer
from attnlab.data.wordpiece import PieceTokenizer, WordPieceTokenizer
from attnlab.errors import UserError
from attnlab.models.bert import (
    MLM_NAMES,
    POOLER_NAMES,
    BertConfig,
    BertMLMHead,
    BertModel,
    encoder_names,
)
from attnlab.models.pretrained import Pretrained
from attnlab.tensor_files import read_tensors

# Tensors a checkpoint may hold that attnlab has no use for (buffers, the next-sentence head,
# a sequence classifier's head: the encoder is what a folder lends).
_IGNORED_PREFIXES = ("embeddings.position_ids", "cls.seq_relationship.", "classifier.")
_TIED_DECODER = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
_PREFIXES = ("bert.", "roberta.")  # the encoder inside BertFor... / XLMRobertaFor... models


def _no_safetensors(path: Path) -> str:
    """Why a directory without model.safetensors is refused, and how to get the file."""
    if not (path / "pytorch_model.bin").is_file():
        return f"{path} has no model.safetensors; download the checkpoint's safetensors weights"
    return (
        f"{path}/pytorch_model.bin is a pickle file, which attnlab never loads (unpickling can "
        "run code): download the checkpoint's model.safetensors instead (huggingface-cli "
        f"download REPO model.safetensors --local-dir {path}), or convert it once, trusting the "
        'file: python -c "from transformers import BertForMaskedLM as M; '
        f"M.from_pretrained('{path}').save_pretrained('{path}', safe_serialization=True)\""
    )


def read_config(path: Path) -> BertConfig:
    """The BertConfig of a checkpoint directory."""
    config_path = path / "config.json"
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{config_path}: not a valid JSON file ({err}); restore it") from None
    if isinstance(raw, dict) and "task" in raw:
        raise UserError(
            f"{path} is an attnlab {raw['task']!r} run, not a BERT checkpoint; "
            "give an `attnlab train mlm` run or a Hugging Face BERT directory"
        )
    try:
        return BertConfig.from_hf(raw)
    except UserError as err:  # a config.json that is not a BERT config: name the folder
        raise UserError(f"{path}: {err}") from None


def read_state(path: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors with ``bert.`` prefixes and gamma/beta names normalised."""
    if not (path / "model.safetensors").is_file():
        raise UserError(_no_safetensors(path))
    raw = read_tensors(path / "model.safetensors", "BERT weights")
    state = {}
    for key, value in raw.items():
        for prefix in _PREFIXES:
            key = key.removeprefix(prefix)
        if key.endswith(".gamma") or key.endswith(".beta"):
            key = key.rsplit(".", 1)[0] + (".weight" if key.endswith(".gamma") else ".bias")
        state[key] = value
    return state


def _check_sizes(path: Path, cfg: BertConfig, state: dict[str, Tensor]) -> None:
    """Refuse a config.json whose sizes the weights do not have, before a model of those sizes
    is allocated (a vocab_size of 10**12 would ask for terabytes); a tensor that is absent is
    left to ``load_bert_weights`` to report."""
    d = cfg.d_model
    expected = {  # HF tensor -> (its shape under config.json, the keys that size it)
        "embeddings.word_embeddings.weight": ((cfg.vocab_size, d), "vocab_size, hidden_size"),
        "embeddings.position_embeddings.weight": (
            (cfg.context + cfg.position_offset, d), "max_position_embeddings"
        ),
        "embeddings.token_type_embeddings.weight": ((cfg.type_vocab_size, d), "type_vocab_size"),
        "encoder.layer.0.intermediate.dense.weight": ((cfg.d_ff, d), "intermediate_size"),
    }
    for name, (shape, keys) in expected.items():
        if name in state and tuple(state[name].shape) != shape:
            raise UserError(
                f"{path}: the checkpoint does not fit its config.json: {keys} give {name} the "
                f"shape {shape}, the weights {tuple(state[name].shape)}; check that config.json "
                "belongs to these weights"
            )
    indices = [k.split(".")[2] for k in state if k.startswith("encoder.layer.")]
    held = max((int(i) + 1 for i in indices if i.isdigit()), default=0)
    if cfg.n_layers > held:
        raise UserError(
            f"{path}: the checkpoint does not fit its config.json: num_hidden_layers is "
            f"{cfg.n_layers}, the weights hold {held} layer(s); check that config.json belongs "
            "to these weights"
        )


def _gather(
    module: nn.Module, names: dict[str, tuple[str, ...]], state: dict[str, Tensor], report: dict
) -> dict[str, Tensor]:
    """Build ``module``'s state dict from HF tensors; record missing and mis-shaped ones."""
    ours_state = module.state_dict()
    out = {}
    for ours, theirs in names.items():
        want = ours_state[ours].shape
        part_shape = (want[0] // len(theirs), *want[1:])
        parts = []
        for name in theirs:
            report["used"].add(name)
            if name not in state:
                report["missing"].append(name)
            elif tuple(state[name].shape) != tuple(part_shape):
                report["misshaped"].append(
                    f"{name}: checkpoint {tuple(state[name].shape)}, model {tuple(part_shape)}"
                )
            else:
                parts.append(state[name].float())
        if len(parts) == len(theirs):
            out[ours] = torch.cat(parts, dim=0)
    return out


def load_bert_weights(
    model: BertModel, state: dict[str, Tensor], mlm: BertMLMHead | None = None
) -> list[str]:
    """Copy HF tensors into ``model`` (and ``mlm``); return notes on parts initialised afresh.

    The pooler and the MLM head are optional: a checkpoint without any of their tensors leaves
    them at their initial values (reported in the notes); without ``mlm`` the checkpoint's MLM
    head is skipped. Anything else that is missing, left over or of the wrong shape raises a
    ValueError that lists every such tensor.
    """
    report: dict = {"used": set(), "missing": [], "misshaped": []}
    notes = []
    parts: list[tuple[nn.Module, dict[str, tuple[str, ...]], str]] = [
        (model, encoder_names(model.cfg), "encoder")
    ]
    optional = [(model, POOLER_NAMES, "pooler")]
    if mlm is not None:
        optional.append((mlm, MLM_NAMES, "MLM head"))
    for module, names, what in optional:
        if any(n in state for theirs in names.values() for n in theirs):
            parts.append((module, names, what))
        else:
            notes.append(f"the checkpoint has no {what}; it starts from BERT's random init")
    loaded = [(module, _gather(module, names, state, report)) for module, names, _ in parts]
    ignored = _IGNORED_PREFIXES + (("cls.predictions.",) if mlm is None else ())
    unexpected = sorted(
        k
        for k in state
        if k not in report["used"] and not k.startswith(ignored) and k not in _TIED_DECODER
    )
    if report["missing"] or unexpected or report["misshaped"]:
        parts = []  # one line: the first few tensors of each kind, and how many there are
        for title, items in (
            ("missing", report["missing"]),
            ("unexpected", unexpected),
            ("mis-shaped", report["misshaped"]),
        ):
            if items:
                more = f", and {len(items) - 3} more" if len(items) > 3 else ""
                parts.append(f"{title} ({len(items)}): " + ", ".join(items[:3]) + more)
        raise UserError(
            "the checkpoint does not fit this BERT architecture: "
            + "; ".join(parts)
            + "; check that config.json belongs to these weights"
        )
    decoder = state.get("cls.predictions.decoder.weight")
    if (
        mlm is not None
        and decoder is not None
        and not torch.equal(decoder.float(), state["embeddings.word_embeddings.weight"].float())
    ):
        raise UserError(
            "the checkpoint's MLM decoder is not tied to the word embeddings; attnlab's BERT "
            "ties them, so this checkpoint cannot be loaded faithfully"
        )
    for module, values in loaded:
        module.load_state_dict(values, strict=False)
    return notes


def read_folder(
    path: str | Path, with_mlm: bool = False
) -> tuple[BertModel, BertMLMHead | None, PieceTokenizer, list[str]]:
    """(encoder, MLM head or None, tokenizer, notes) of a checkpoint folder."""
    model, mlm, tokenizer, notes, _ = _read(Path(path), with_mlm)
    return model, mlm, tokenizer, notes


def _read(
    path: Path, with_mlm: bool | None
) -> tuple[BertModel, BertMLMHead | None, PieceTokenizer, list[str], tuple[str, ...]]:
    """``read_folder`` and the encoder's state-dict names the checkpoint did not provide;
    ``with_mlm`` None: the MLM head when the checkpoint has one."""
    if not (path / "config.json").is_file():
        raise UserError(f"{path} is not a checkpoint folder (no config.json)")
    cfg = read_config(path)
    state = read_state(path)
    _check_sizes(path, cfg, state)
    pos = "embeddings.position_embeddings.weight"
    if cfg.position_offset and pos in state:  # XLM-R: the padding rows are never read
        state[pos] = state[pos][cfg.position_offset :]
    model = BertModel(cfg)
    if with_mlm is None:
        with_mlm = any(name.startswith("cls.predictions.") for name in state)
    mlm = BertMLMHead(cfg) if with_mlm else None
    notes = load_bert_weights(model, state, mlm)
    pooled = any(name in state for theirs in POOLER_NAMES.values() for name in theirs)
    fresh = () if pooled else tuple(POOLER_NAMES)
    tokenizer: PieceTokenizer
    if (path / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(path / "tokenizer.json")  # WordPiece or XLM-R's unigram
    else:
        tokenizer = WordPieceTokenizer.from_dir(path)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise UserError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} pieces but the model only "
            f"{cfg.vocab_size} word embeddings; the two do not belong together"
        )
    return model, mlm, tokenizer, notes, fresh


def open_folder(
    path: str | Path, name: str | None = None, source: dict[str, str] | None = None
) -> Pretrained:
    """A checkpoint folder as a :class:`Pretrained` encoder. It reads at most its positions,
    or a sentence-transformers folder's ``max_seq_length`` (``sentence_bert_config.json``)."""
    path = Path(path)
    model, mlm, tokenizer, notes, fresh = _read(path, with_mlm=None)
    max_len = model.cfg.context
    st_config = path / "sentence_bert_config.json"
    if st_config.is_file():
        raw = read_json(st_config, "sentence-transformers config", keys={"max_seq_length": int})
        if raw["max_seq_length"] < 1:
            raise UserError(
                f"{st_config}: max_seq_length must be >= 1, got {raw['max_seq_length']}; "
                "restore the file"
            )
        max_len = min(max_len, raw["max_seq_length"])
    where = source or {"weights": f"{path.resolve()} (a checkpoint folder)"}
    return Pretrained(
        name or str(path), model, tokenizer, max_len, where, notes=notes, fresh=fresh, mlm=mlm
    )
