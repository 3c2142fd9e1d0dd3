"""The ONNX file of ``attnlab export --format onnx``: inputs ``input_ids`` and
``attention_mask`` (int64, batch x length, both dynamic, right padding), output ``logits``.

The graph cuts an input longer than the run's ``max_len`` as ``attnlab predict`` does (its
first pieces, then the end token), so a caller whose tokenizer does not truncate gets
predict's numbers. A 4-bit word table stays 4-bit in the graph (the rows looked up are unpacked
there). torch's exporter needs the ``onnx`` and ``onnxscript`` packages; running the file
needs ``onnxruntime``.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import torch
from torch import Tensor, nn

from attnlab.errors import UserError

NEEDS = ("onnx", "onnxscript")


def install_line() -> str:
    """The pip command that installs what the exporter needs, at attnlab's pinned versions
    (the ``export`` extra of its metadata)."""
    try:
        wanted = [r.split(";")[0].strip() for r in metadata.requires("attnlab") or []
                  if 'extra == "export"' in r]  # fmt: skip
    except metadata.PackageNotFoundError:
        wanted = []
    return "pip install " + " ".join(wanted or NEEDS)


def check_exporter() -> None:
    """Refuse, before any work, when torch's ONNX exporter cannot run here."""
    missing = []
    for name in NEEDS:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise UserError(
            f"ONNX export needs {' and '.join(missing)}, not installed: {install_line()} (in an "
            "attnlab checkout, pip install -e '.[export]' does the same)"
        )


class TruncatingClassifier(nn.Module):
    """(input_ids, attention_mask) -> logits, an input cut to ``max_len`` tokens first."""

    def __init__(self, model: nn.Module, max_len: int, end_id: int) -> None:
        super().__init__()
        self.model, self.max_len, self.end_id = model, max_len, end_id

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        lengths = attention_mask.sum(dim=1)  # (B,): right padding
        # T' = min(T, max_len) as one symbolic size, the columns gathered into a new tensor:
        # slicing ([:, :max_len], a view) makes the exporter assume T below max_len (the
        # example's case) for the whole graph
        width = torch.sym_min(input_ids.shape[1], self.max_len)
        keep = torch.arange(width, device=input_ids.device)  # (T',)
        ids = input_ids.index_select(1, keep)  # (B, T')
        last = (lengths > self.max_len)[:, None] & (keep == self.max_len - 1)[None]  # (B, T')
        ids = torch.where(last, torch.full_like(ids, self.end_id), ids)  # a cut row ends in </s>
        return self.model(ids, lengths.clamp(max=self.max_len))  # (B, C)


def write_onnx(model: nn.Module, max_len: int, cls_id: int, end_id: int, path: Path) -> None:
    """The graph of ``model`` in ``path``."""
    wrapper = TruncatingClassifier(model, max_len, end_id).eval()
    ids = torch.tensor([[cls_id, 10, 11, end_id]] * 2)
    mask = torch.ones_like(ids)
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    dims = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}
    with torch.no_grad():
        # the graph is captured here, not by torch.onnx.export: its capture tries one strategy
        # after another and takes Ctrl-C in one for that strategy's failure
        program = torch.export.export(wrapper, (ids, mask), dynamic_shapes=dims)
        torch.onnx.export(program, f=str(path), input_names=["input_ids", "attention_mask"],
                          output_names=["logits"], dynamo=True, external_data=False)  # fmt: skip
