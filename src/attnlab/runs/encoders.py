"""The one door to a pretrained encoder: ``open_encoder(name_or_folder)``.

Every verb that reads text with pretrained weights asks here — `train classify --arch`,
`train mlm --init`, embed, similarity, search, explore — and gets a
:class:`~attnlab.models.pretrained.Pretrained` (encoder, tokenizer, input prefixes, source):

- a registered model with published weights (``attnlab models`` marks them): ``e5``,
  ``minilm``; the model registry loads them;
- an attnlab pretraining run (`attnlab train mlm`): the task that made it lends its encoder;
- a Hugging Face BERT or XLM-RoBERTa checkpoint folder (bert-base-chinese, xlm-roberta-base, an
  `attnlab export --format hf` folder).

No model is recognised here by its name: the registry says which names have weights.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.errors import UserError
from attnlab.models.bert_folder import open_folder
from attnlab.models.pretrained import Pretrained
from attnlab.models.registry import list_models, load_pretrained, pretrained_names
from attnlab.runs.load import recorded
from attnlab.runs.registry import get_task


def encoder_help() -> str:
    """What ``--arch`` (and every option naming a pretrained encoder) accepts, for help texts."""
    names = " | ".join(pretrained_names())
    return f"{names}, a BERT / XLM-R checkpoint folder, or an `attnlab train mlm` run"


def is_encoder_name(spec: str | Path) -> bool:
    """Whether ``spec`` names a registered model with published weights."""
    return str(spec) in pretrained_names()


def open_encoder(spec: str | Path, role: str = "query") -> Pretrained:
    """The pretrained encoder ``spec`` names, its tokenizer reading texts of ``role`` (for an
    encoder trained with input prefixes, such as e5's "query: " and "passage: ")."""
    if is_encoder_name(spec):
        encoder = load_pretrained(str(spec))
        return _with_role(encoder, role)
    path = Path(spec)
    if not path.is_dir():
        known = " or ".join(pretrained_names())
        other = sorted(set(list_models()) - set(pretrained_names()))
        hint = (
            f" ({spec} is an architecture without published weights)" if str(spec) in other else ""
        )
        raise UserError(
            f"{spec}: no pretrained encoder of that name and no such folder{hint}; give {known}, "
            "a BERT / XLM-R checkpoint folder, or an `attnlab train mlm` run"
        )
    kind = recorded(path)
    if kind is not None:
        encoder = get_task(kind[0]).pretrained(path)
    elif (path / "config.json").is_file():  # a checkpoint folder: its reader names any damage
        encoder = open_folder(path, str(path.resolve()))
    else:
        raise UserError(
            f"{path} is not a checkpoint folder (no config.json) nor an attnlab run; give a "
            "BERT / XLM-R checkpoint folder or an `attnlab train mlm` run"
        )
    return _with_role(encoder, role)


def _with_role(encoder: Pretrained, role: str) -> Pretrained:
    """``encoder`` reading texts of ``role``; an encoder without prefixes reads every role."""
    if not encoder.prefixes or role == encoder.role:
        return encoder
    encoder.tokenizer, encoder.role = encoder.tokenizer_for(role), role
    return encoder
