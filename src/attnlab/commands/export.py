"""`attnlab export RUN --format hf|onnx --out PATH`: a fine-tuned classifier for other tools.

``hf`` writes a Hugging Face folder that ``AutoModelForSequenceClassification`` and
``AutoTokenizer`` load with the run's logits:

- ``pooling = "cls"``: the native class (``BertForSequenceClassification`` or
  ``XLMRobertaForSequenceClassification``): the [CLS] pooler is their ``dense`` + tanh and the
  head their output layer, so no custom code is needed;
- ``pooling = "mean"`` (the default, e5's own pooling): no Hugging Face class averages the
  tokens, so the folder carries ``modeling_attnlab.py``, a 40-line class on the library's own
  encoder (mean over the attention mask, then the linear head), named in config.json's
  ``auto_map``; load it with ``trust_remote_code=True``.

The tokenizer is the run's ``tokenizer.json`` (e5's "query: " prefix included) behind
``PreTrainedTokenizerFast``. ``onnx`` writes one ONNX graph, inputs ``input_ids`` and
``attention_mask`` (int64, batch × length, both dynamic), output ``logits``; onnxruntime runs it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from attnlab.errors import UserError
from attnlab.models.bert import POOLER_NAMES, BertConfig, BertModel, encoder_names

FORMATS = ("hf", "onnx")
REMOTE_MODULE = "modeling_attnlab"
REMOTE_CLASS = "MeanPoolForSequenceClassification"


def export_run(run_dir: str | Path, fmt: str, out: str | Path) -> Path:
    """Write the run's classifier to ``out`` in ``fmt``; returns the path written."""
    from attnlab.infer.classifier import ClassifierRun
    from attnlab.runs.load import load_run

    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    out = Path(out)
    if out.exists() and (fmt == "onnx" or not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} exists; give a new path")
    run = load_run(run_dir)
    if not isinstance(run, ClassifierRun):
        raise UserError(f"{run_dir} holds a {run.task!r} run; export takes classifier runs")
    if type(getattr(run.model, "bert", None)) is not BertModel:
        raise UserError(
            f"{run_dir}: only BERT / XLM-R classifiers export (this one's encoder is "
            f"{type(run.model.bert).__name__})"
        )
    staging = out.with_name(f".{out.name}.partial")
    if staging.exists():
        raise UserError(f"{staging} exists (an interrupted export?); remove it and retry")
    try:
        if fmt == "hf":
            _write_hf(run, staging)
        else:
            _write_onnx(run, staging)
        staging.rename(out)
    finally:
        if staging.is_dir():
            shutil.rmtree(staging)
        elif staging.exists():
            staging.unlink()
    return out


# ---------------------------------------------------------------------------- Hugging Face


def hf_config(cfg: BertConfig, labels: list[str], pooling: str) -> dict[str, Any]:
    """config.json of the exported classifier."""
    xlmr = cfg.position_offset > 0
    out = cfg.to_hf() | {
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
        "max_position_embeddings": cfg.context + cfg.position_offset,
    }
    if xlmr:
        out |= {"model_type": "xlm-roberta", "bos_token_id": 0, "eos_token_id": 2}
    if pooling == "cls":
        name = "XLMRobertaForSequenceClassification" if xlmr else "BertForSequenceClassification"
        out["architectures"] = [name]
    else:
        out["architectures"] = [REMOTE_CLASS]
        out["auto_map"] = {"AutoModelForSequenceClassification": f"{REMOTE_MODULE}.{REMOTE_CLASS}"}
    return out


def hf_tensors(model: nn.Module, pooling: str) -> dict[str, Tensor]:
    """The classifier's tensors under the exported class's names."""
    bert: BertModel = model.bert  # type: ignore[assignment]
    cfg = bert.cfg
    prefix = "roberta." if cfg.position_offset else "bert."
    state = {k: v.detach().float() for k, v in bert.state_dict().items()}
    state["embeddings.word.weight"] = bert.embeddings.word.weight.detach().float()
    out: dict[str, Tensor] = {}
    for ours, theirs in encoder_names(cfg).items():
        for name, part in zip(theirs, state[ours].chunk(len(theirs), dim=0)):
            out[prefix + name] = part.contiguous()
    pos = prefix + "embeddings.position_embeddings.weight"
    if cfg.position_offset:  # rows before the first real position: padding's, never read
        pad = torch.zeros(cfg.position_offset, cfg.d_model)
        out[pos] = torch.cat([pad, out[pos]])
    head = {k: v.detach().float().contiguous() for k, v in model.head.state_dict().items()}
    if pooling == "mean":
        out |= {"classifier.weight": head["weight"], "classifier.bias": head["bias"]}
    elif cfg.position_offset:  # XLMRobertaClassificationHead: dense + tanh, then out_proj
        out |= {
            "classifier.dense.weight": state["pooler.weight"],
            "classifier.dense.bias": state["pooler.bias"],
            "classifier.out_proj.weight": head["weight"],
            "classifier.out_proj.bias": head["bias"],
        }
    else:  # BERT's pooler, then the classifier
        for ours, (theirs,) in POOLER_NAMES.items():
            out[prefix + theirs] = state[ours]
        out |= {"classifier.weight": head["weight"], "classifier.bias": head["bias"]}
    return out


REMOTE_CODE = '''"""Mean-pooled sequence classifier written by `attnlab export`: the encoder's
token states averaged over the attention mask, then one linear layer (attnlab's BertClassifier).
"""

import torch
from transformers import AutoConfig, AutoModel, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput


class MeanPoolForSequenceClassification(PreTrainedModel):
    config_class = AutoConfig

    def __init__(self, config):
        super().__init__(config)
        self.base_model_prefix = "roberta" if config.model_type == "xlm-roberta" else "bert"
        encoder = AutoModel.from_config(config, add_pooling_layer=False)
        setattr(self, self.base_model_prefix, encoder)
        self.dropout = torch.nn.Dropout(config.hidden_dropout_prob)
        self.classifier = torch.nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        encoder = getattr(self, self.base_model_prefix)
        hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        keep = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * keep).sum(1) / keep.sum(1).clamp(min=1)  # (B, D)
        logits = self.classifier(self.dropout(pooled))  # (B, C)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)
'''


def _write_hf(run: Any, path: Path) -> None:
    pooling = run.model.pooling
    path.mkdir(parents=True)
    config = hf_config(run.model.bert.cfg, run.labels.labels, pooling)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(hf_tensors(run.model, pooling), str(path / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    if pooling == "mean":
        (path / f"{REMOTE_MODULE}.py").write_text(REMOTE_CODE, encoding="utf-8")
    run.tokenizer.save(path / "tokenizer.json")
    tok = run.tokenizer
    names = {i: tok._tok.id_to_token(i) for i in tok.special_ids}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": run.max_len,
        "padding_side": "right",
        "truncation_side": "right",
        "pad_token": names[tok.pad_id],
        "unk_token": names[tok.unk_id],
        "cls_token": names[tok.cls_id],
        "sep_token": names[tok.sep_id],
        "mask_token": names[tok.mask_id],
    }
    (path / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )


# ---------------------------------------------------------------------------- ONNX


class _MaskedClassifier(nn.Module):
    """(input_ids, attention_mask) -> logits, the interface ONNX users expect."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        lengths = attention_mask.sum(dim=1)  # (B,): right padding
        return self.model(input_ids, lengths)  # (B, C)


def _write_onnx(run: Any, path: Path) -> None:
    try:
        import onnx  # noqa: F401  (torch's exporter needs it)
    except ImportError:
        raise UserError("ONNX export needs the onnx package: pip install onnx onnxscript") from None
    wrapper = _MaskedClassifier(run.model).eval()
    ids = torch.tensor([[run.tokenizer.cls_id, 10, 11, run.tokenizer.sep_id]] * 2)
    mask = torch.ones_like(ids)
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", max=run.max_len)
    with torch.no_grad():
        torch.onnx.export(
            wrapper, (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
            output_names=["logits"], dynamo=True, external_data=False,
            dynamic_shapes={"input_ids": {0: batch, 1: length},
                            "attention_mask": {0: batch, 1: length}},
        )  # fmt: skip
