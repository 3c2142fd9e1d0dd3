"""`attnlab quantize RUN --out OUT`: a copy of a run whose linear layers hold int8 weights.

OUT holds everything RUN holds (config, tokenizer, data report, results, plots) except the
training state (state/: a quantised run is for inference, it cannot be trained further) and
the weights, rewritten with every nn.Linear as an :class:`attnlab.compress.int8.Int8Linear` (a head
tied to the embedding stays float). ``quantization.json`` records the scheme and the source.
Every verb loads OUT as it loads RUN: ``load_tensors_into`` sees the int8 tensors and swaps the
layers in before loading (attnlab.compress.int8.prepare_for_int8_weights).
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from attnlab.compress.int8 import Activations, quantize_model
from attnlab.data.io import write_json
from attnlab.errors import UserError
from attnlab.runs.folder import (
    LOCK,
    QUANTIZED,
    WEIGHTS,
    check_derived_out,
    check_not_quantized,
    derived_copy,
)
from attnlab.runs.load import load_run
from attnlab.tensor_files import read_tensors
from attnlab.train.checkpoint import save_weights

SKIP = {"state", WEIGHTS, LOCK, "lock"}


def _weights_module(run: object, keys: set[str]) -> nn.Module:
    """The module of ``run`` that model.safetensors was loaded into."""
    # one module under two names (a classifier's model and the path it infers with) is one
    modules = list({id(v): v for v in vars(run).values() if isinstance(v, nn.Module)}.values())
    found = modules if len(modules) == 1 else [m for m in modules if keys <= set(m.state_dict())]
    if len(found) != 1:
        raise UserError(
            f"{getattr(run, 'run_dir', run)}: a {type(run).__name__} does not hold one model "
            "that attnlab quantize can reach; quantise its classifier or LM runs instead"
        )
    return found[0]


def quantize_run(run_dir: str | Path, out: str | Path, activations: Activations = "none") -> dict:
    """Write the int8 copy of ``run_dir`` into ``out``; returns what quantization.json says."""
    run_dir, out = Path(run_dir), Path(out)
    if activations not in ("none", "dynamic"):
        raise UserError(f"--activations must be none or dynamic, got {activations!r}")
    check_not_quantized(run_dir, "quantize")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} exists and is not an empty folder; give a new folder")
    check_derived_out(run_dir, out, "quantize")
    run = load_run(run_dir, "cpu")
    keys = set(read_tensors(run_dir / WEIGHTS))
    model = _weights_module(run, keys)
    layers = quantize_model(model, activations)
    if not layers:
        raise UserError(f"{run_dir}: the model has no nn.Linear layer to quantise")
    info = {
        "method": "int8 weights, symmetric per output channel (scale = max|w| / 127.5)",
        "activations": "int8 per token, dynamic" if activations == "dynamic" else "float",
        "layers": len(layers),
        "source": str(run_dir),
    }
    with derived_copy(run_dir, out, SKIP) as staging:
        save_weights(model, staging / WEIGHTS)
        write_json(staging / QUANTIZED, info)
    return info
