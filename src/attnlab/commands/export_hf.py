"""The Hugging Face folder of ``attnlab export --format hf``: config, tensors, tokenizer, code.

What the folder gives the standard snippet (``AutoTokenizer`` +
``AutoModelForSequenceClassification.from_pretrained(DIR)``, or ``pipeline("text-classification",
model=DIR)``):

- ``pooling = "cls"``: the native class (``XLMRobertaForSequenceClassification`` or
  ``BertForSequenceClassification``), no code of ours: attnlab's [CLS] pooler is their
  ``dense`` + tanh (XLM-R's classification head, BERT's pooler) and the run's head their output
  layer. Its position table stops at the run's ``max_len``: a longer input fails with
  transformers' own warning and an index error unless the call passes ``truncation=True``,
  rather than reading more of the text than ``attnlab predict`` does;
- ``pooling = "mean"``: no Hugging Face class averages the tokens, so the folder carries
  ``modeling_attnlab.py`` (the library's own encoder, the mean over the attention mask, the
  run's head) under a model type of its own. Without ``trust_remote_code=True`` transformers
  refuses the folder with an error (it cannot fall back to a class with a random head); with it,
  the class cuts a longer input as ``predict`` does and numbers positions as attnlab does.

The word table is written in float16 when the run keeps it 4-bit (half of float32's size; its
values round by at most 2^-11 of their size), else in float32 as the run has it;
``config.json`` says ``dtype: float32``, so transformers computes in float32 either way. Every
file is readable by others (0644).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.models.bert import POOLER_NAMES, BertConfig, BertModel, encoder_names
from attnlab.tensor_files import save_safetensors

REMOTE_MODULE = "modeling_attnlab"


def native_class(cfg: BertConfig) -> str:
    xlmr = cfg.position_offset > 0
    return f"{'XLMRoberta' if xlmr else 'Bert'}ForSequenceClassification"


def hf_config(cfg: BertConfig, labels: list[str], pooling: str, max_len: int, end_id: int) -> dict:
    """config.json of the exported classifier."""
    xlmr = cfg.position_offset > 0
    out = cfg.to_hf() | {
        "id2label": dict(enumerate(labels)),
        "label2id": {label: i for i, label in enumerate(labels)},
        "max_position_embeddings": max_len + cfg.position_offset,  # no row past max_len
        "dtype": "float32",
    }
    if xlmr:
        out |= {"model_type": "xlm-roberta", "bos_token_id": 0, "eos_token_id": 2}
    if pooling == "cls":
        return out | {"architectures": [native_class(cfg)]}
    name = "XLMRoberta" if xlmr else "Bert"
    model_type = f"attnlab_{'xlm_roberta' if xlmr else 'bert'}_mean"
    return out | {
        "architectures": [f"{name}MeanPoolForSequenceClassification"],
        "model_type": model_type,
        "auto_map": {
            "AutoConfig": f"{REMOTE_MODULE}.{name}MeanPoolConfig",
            "AutoModelForSequenceClassification": (
                f"{REMOTE_MODULE}.{name}MeanPoolForSequenceClassification"
            ),
        },
        "attnlab_max_len": max_len,
        "attnlab_end_id": end_id,
    }


def _full_heads(name: str, tensor: Tensor, cfg: BertConfig) -> Tensor:
    """A pruned layer's attention tensor widened to all ``n_heads`` heads: the heads it lost
    come back with zero weights (zero queries, keys and values, and zero columns of the output
    projection), which add exactly nothing to the layer's output."""
    width = cfg.d_model  # n_heads x head size
    if ".attention.output.dense.weight" in name and tensor.shape[1] < width:
        return torch.cat([tensor, tensor.new_zeros(tensor.shape[0], width - tensor.shape[1])], 1)
    if ".attention.self." in name and tensor.shape[0] < width:
        pad = tensor.new_zeros(width - tensor.shape[0], *tensor.shape[1:])
        return torch.cat([tensor, pad])
    return tensor


def hf_tensors(model: nn.Module, pooling: str, max_len: int, word_dtype: torch.dtype) -> dict:
    """The classifier's tensors under the exported class's names."""
    bert: BertModel = model.bert  # type: ignore[assignment]
    cfg = bert.cfg
    prefix = "roberta." if cfg.position_offset else "bert."
    state = {k: v.detach() for k, v in bert.state_dict().items()}
    state["embeddings.word.weight"] = bert.embeddings.word.weight.detach()
    out: dict[str, Tensor] = {}
    for ours, theirs in encoder_names(cfg).items():
        for name, part in zip(theirs, state[ours].chunk(len(theirs), dim=0)):
            out[prefix + name] = _full_heads(name, part, cfg).contiguous()
    words = prefix + "embeddings.word_embeddings.weight"
    out[words] = out[words].to(word_dtype)
    pos = prefix + "embeddings.position_embeddings.weight"
    # rows before the first real position are padding's, never read; none past max_len
    pad = out[pos].new_zeros(cfg.position_offset, cfg.d_model)
    out[pos] = torch.cat([pad, out[pos][:max_len]]).contiguous()
    head = {k: v.detach().contiguous() for k, v in model.head.state_dict().items()}
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


REMOTE_CODE = '''"""Mean-pooled sequence classifier written by `attnlab export`: the encoder's token
states averaged over the attention mask, then one linear layer, as attnlab's classifier reads a
text. An input longer than the run read in training is cut as `attnlab predict` cuts it (its
first pieces, then the end token); positions are numbered 0, 1, 2, ... over every token as
attnlab numbers them.
"""

import torch
from transformers import {encoder}Config, {encoder}Model, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.utils import logging

logger = logging.get_logger(__name__)


class {encoder}MeanPoolConfig({encoder}Config):
    model_type = "{model_type}"


class {encoder}MeanPoolForSequenceClassification(PreTrainedModel):
    config_class = {encoder}MeanPoolConfig
    base_model_prefix = "{prefix}"

    def __init__(self, config):
        super().__init__(config)
        self.{prefix} = {encoder}Model(config, add_pooling_layer=False)
        self.dropout = torch.nn.Dropout(config.hidden_dropout_prob)
        self.classifier = torch.nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        limit = self.config.attnlab_max_len
        if input_ids.shape[1] > limit:  # (B, T) -> (B, limit), right padding
            logger.warning_once(f"input cut to the {{limit}} tokens the model reads")
            cut = attention_mask.sum(1) > limit  # (B,): rows that were longer
            input_ids, attention_mask = input_ids[:, :limit], attention_mask[:, :limit]
            last = torch.zeros_like(input_ids, dtype=torch.bool)
            last[:, -1] = cut
            input_ids = input_ids.masked_fill(last, self.config.attnlab_end_id)
        hidden = getattr(self, self.base_model_prefix)(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state  # (B, T, D)
        keep = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * keep).sum(1) / keep.sum(1).clamp(min=1)  # (B, D)
        logits = self.classifier(self.dropout(pooled))  # (B, C)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)
'''


def remote_code(cfg: BertConfig) -> str:
    xlmr = cfg.position_offset > 0
    return REMOTE_CODE.format(
        encoder="XLMRoberta" if xlmr else "Bert",
        model_type=f"attnlab_{'xlm_roberta' if xlmr else 'bert'}_mean",
        prefix="roberta" if xlmr else "bert",
    )


def tokenizer_config(tok: Any, max_len: int) -> dict:
    names = {i: tok._tok.id_to_token(i) for i in tok.special_ids}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,  # truncation=True cuts here, as predict does
        "padding_side": "right",
        "truncation_side": "right",
        "pad_token": names[tok.pad_id],
        "unk_token": names[tok.unk_id],
        "cls_token": names[tok.cls_id],
        "sep_token": names[tok.sep_id],
        "mask_token": names[tok.mask_id],
    }


def save_truncating(tokenizer: Any, path: Path, max_len: int) -> None:
    """The run's tokenizer.json with a truncation block at ``max_len``: a reader of the file
    through the tokenizers library (an ONNX user) cuts a long text as predict does.
    transformers keeps the block off unless the call asks for ``truncation=True``."""
    tokenizer.save(path)
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["truncation"] = {"direction": "Right", "max_length": max_len, "strategy": "LongestFirst",
                         "stride": 0}  # fmt: skip
    path.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")


def write_hf(model: nn.Module, tokenizer: Any, labels: list[str], max_len: int, path: Path,
             word_dtype: torch.dtype) -> None:  # fmt: skip
    """The folder in ``path`` (an empty folder)."""
    cfg: BertConfig = model.bert.cfg  # type: ignore[assignment]
    pooling = model.pooling
    config = hf_config(cfg, labels, pooling, max_len, tokenizer.sep_id)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tensors = hf_tensors(model, pooling, max_len, word_dtype)
    save_safetensors(tensors, path / "model.safetensors", metadata={"format": "pt"})
    if pooling == "mean":
        (path / f"{REMOTE_MODULE}.py").write_text(remote_code(cfg), encoding="utf-8")
    save_truncating(tokenizer, path / "tokenizer.json", max_len)
    (path / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(tokenizer, max_len), indent=2, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
