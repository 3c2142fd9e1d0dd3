"""`attnlab export RUN --format hf|onnx --out PATH`: a fine-tuned classifier for other tools.

``hf`` writes a Hugging Face folder (attnlab.commands.export_hf: the native class for a
[CLS]-pooled run, code of its own that transformers refuses to run without
``trust_remote_code=True`` for a mean-pooled one), ``onnx`` one ONNX graph
(attnlab.commands.export_onnx). Either reproduces ``attnlab predict`` or fails loudly; never a
random head, never silently less or more of a text than the run reads.

What it guards, before the model is even loaded:

- ``--out`` must not exist and must be writable: it is claimed at once (a folder made, or an
  empty file created, exclusively), so a second export to the same path, even one running at
  the same moment, is refused instead of replacing the first; the export is written beside it
  under a temporary name and moved over the claim when complete. Ctrl-C or any failure
  removes both;
- a run of another kind (not a fine-tuned BERT / XLM-R classifier), and an int8 run whose
  activations are quantised too (no float graph computes what it computes): one line, exit 2.

An int8 run of int8 weights alone exports its weights dequantised to float (the function the
run computes; the size of the float run). A pruned run's smaller attention layers are widened
back to every head with zero weights, exactly equal (transformers builds every layer with the
same number of heads).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.errors import UserError

FORMATS = ("hf", "onnx")
WORDS = ("auto", "float16", "float32")


@dataclass
class Export:
    """What was written, and what a user should know about it."""

    path: Path
    notes: list[str] = field(default_factory=list)


def check_out(out: Path) -> None:
    """Refuse an ``--out`` that exists or that cannot be made (a file above it)."""
    if os.path.lexists(out):
        raise UserError(f"--out {out} exists; give a new path")
    above = next(p for p in out.absolute().parents if p.exists())
    if not above.is_dir():
        raise UserError(f"--out {out}: {above} is a file, not a folder; give another path")


@contextlib.contextmanager
def claimed(out: Path, folder: bool) -> Iterator[Path]:
    """Claim ``out`` (a folder or a file, created exclusively), yield a temporary path beside
    it to write, then move that over the claim; on any failure or Ctrl-C remove both."""
    check_out(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if folder:
            out.mkdir()
        else:
            out.open("x").close()
    except FileExistsError:
        raise UserError(f"--out {out} exists; give a new path") from None
    except OSError as err:
        raise UserError(
            f"cannot write --out {out} ({err.strerror}); give a path in a folder you can write to"
        ) from None
    staging = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        if folder:
            staging.mkdir()
        yield staging
        os.replace(staging, out)  # over the claim: our own empty folder or file
    except BaseException:
        if staging.is_dir():
            shutil.rmtree(staging)
        else:
            staging.unlink(missing_ok=True)
        if out.is_dir():
            shutil.rmtree(out)
        else:
            out.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C ends the block with KeyboardInterrupt whatever a library inside made of it.

    torch's ONNX exporter took a Ctrl-C during its graph capture for that capture's failure
    (an ordinary exception by the time it reached its loop over capture strategies), went on
    with the next strategy and wrote the file. The handler raises as Python's does and notes
    the signal; an exception leaving the block after one, or a clean end, becomes
    KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():  # no signals there
        yield
        return
    seen: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        seen.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    except BaseException:
        if seen:
            raise KeyboardInterrupt from None
        raise
    else:
        if seen:
            raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, previous)


def float_model(run: Any, notes: list[str]) -> nn.Module:
    """The run's classifier with its int8 linear layers (weights only) dequantised to float;
    refused when its activations are int8 too."""
    from attnlab.compress.int8 import Int8Linear

    model = run.model
    layers = {name: m for name, m in model.named_modules() if isinstance(m, Int8Linear)}
    if any(m.dynamic for m in layers.values()):
        raise UserError(
            f"{run.run_dir} quantises activations to int8 as it runs (quantize --activations "
            "dynamic); no float graph computes that: export the run it was made from"
        )
    for name, layer in layers.items():
        linear = nn.Linear(layer.in_features, layer.out_features, layer.bias is not None)
        linear.weight.data.copy_(layer.weight)
        if layer.bias is not None:
            linear.bias.data.copy_(layer.bias.detach())
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, linear)
    if layers:
        notes.append(
            f"{len(layers)} int8 linear layers written as float32 (their dequantised weights: "
            "the function the run computes, at the float run's size)"
        )
    return model.float().eval()


def load_classifier(run_dir: str | Path) -> Any:
    """The run, refused in one line unless it is a fine-tuned BERT / XLM-R classifier."""
    from attnlab.models.bert import BertModel
    from attnlab.runs.load import load_run

    run = load_run(run_dir)
    model = getattr(run, "model", None)
    if not isinstance(getattr(model, "bert", None), BertModel) or type(model.bert) is not BertModel:
        kind = type(getattr(model, "bert", model)).__name__
        raise UserError(
            f"{run_dir}: export takes a classifier fine-tuned from a BERT or XLM-R encoder "
            f"(e5, minilm, a BERT folder); this run's model is a {kind}"
        )
    return run


def word_dtype(choice: str, model: nn.Module) -> torch.dtype:
    if choice not in WORDS:
        raise UserError(f"--words must be one of {', '.join(WORDS)}, got {choice!r}")
    packed = model.bert.cfg.packed_words  # type: ignore[union-attr]
    if choice == "auto":
        choice = "float16" if packed else "float32"
    return torch.float16 if choice == "float16" else torch.float32


def export_run(run_dir: str | Path, fmt: str, out: str | Path, words: str = "auto") -> Export:
    """Write the run's classifier to ``out`` in ``fmt``."""
    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if words not in WORDS:
        raise UserError(f"--words must be one of {', '.join(WORDS)}, got {words!r}")
    if fmt == "onnx":
        from attnlab.commands.export_onnx import check_exporter

        check_exporter()
    out = Path(out)
    result = Export(out)
    with claimed(out, folder=fmt == "hf") as staging, interruptible():
        run = load_classifier(run_dir)
        model = float_model(run, result.notes)
        tok = run.tokenizer
        if fmt == "hf":
            from attnlab.commands.export_hf import write_hf

            dtype = word_dtype(words, model)
            if dtype == torch.float16:
                result.notes.append(
                    "word table in float16, the run's 4-bit values rounded (--words float32 "
                    "keeps them exact, twice the size)"
                )
            write_hf(model, tok, run.labels.labels, run.max_len, staging, dtype)
        else:
            from attnlab.commands.export_onnx import write_onnx

            write_onnx(model, run.max_len, tok.cls_id, tok.sep_id, staging)
    return result
