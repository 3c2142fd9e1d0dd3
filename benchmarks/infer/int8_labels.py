"""Which int8 scheme keeps a trained classifier's labels: the measurement behind predict's
choice of bf16, not int8, as the fast path that keeps float32's labels.

    python -m benchmarks.infer.int8_labels RUN [--calibration 256] [--alphas 0.5,0.75]
        -> docs/results/int8_labels.{json,md}

On the run's validation and test splits (one thread), every scheme's probabilities against
float32's: labels changed, the largest and the 99th-percentile |p - p_fp32|, and the share of
texts a guard like bf16's (``attnlab.infer.precision.Guarded``) would run again in float32 if
its margin were twice the scheme's largest change on validation. The schemes, each on every
``nn.Linear`` of the encoder's blocks (the pooler and head stay float32):

* torch.ao dynamic int8 (``quantize_dynamic``), weights per tensor: predict's ``int8`` path;
* the same with weights per output channel (``per_channel_dynamic_qconfig``);
* attnlab's int8 layers (``attnlab.compress.int8``): weights per output channel, activations
  per token (each row its own scale, ``torch._int_mm``);
* each per-channel scheme after SmoothQuant's scale migration (Xiao et al. 2023, eq. 4):
  s_j = max|X_j|^α / max|W_j|^(1-α) over input channel j, W' = W diag(s), X' = X diag(s)^-1, the
  activation maxima read on ``--calibration`` training texts. The blocks are post-LN, so the
  division cannot fold into a LayerNorm (its output also feeds the residual): it runs before
  each Linear;
* bf16 autocast, predict's ``bf16`` pass before its re-run, for scale.
"""

from __future__ import annotations

import argparse
import copy
import json
import warnings

import torch
from torch import Tensor, nn

from benchmarks.common import command_line, load_average, machine, machine_line, write_results

STEM = "int8_labels"
BATCH = 64


class Smoothed(nn.Module):
    """``linear`` (its weight already times s per input channel) reading x / s."""

    def __init__(self, linear: nn.Module, inverse_scale: Tensor) -> None:
        super().__init__()
        self.linear = linear
        self.register_buffer("inverse_scale", inverse_scale)  # (in,)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x * self.inverse_scale)  # (..., out)


def block_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The Linear layers inside the encoder's blocks, by name."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and ".blocks." in f".{name}"}  # fmt: skip


def activation_maxima(model: nn.Module, probs, texts: list[str]) -> dict[str, Tensor]:
    """max |x_j| over ``texts`` of every block Linear's input, per input channel."""
    maxima: dict[str, Tensor] = {}

    def hook(name: str):
        def record(_module: nn.Module, inputs: tuple[Tensor, ...], _out: Tensor) -> None:
            x = inputs[0].detach().abs().reshape(-1, inputs[0].shape[-1]).amax(0)  # (in,)
            maxima[name] = torch.maximum(maxima[name], x) if name in maxima else x

        return record

    hooks = [m.register_forward_hook(hook(n)) for n, m in block_linears(model).items()]
    try:
        probs(model, texts)
    finally:
        for h in hooks:
            h.remove()
    return maxima


def smoothed(model: nn.Module, maxima: dict[str, Tensor], alpha: float) -> nn.Module:
    """A copy of ``model`` with every block Linear's input scale migrated into its weight."""
    model = copy.deepcopy(model)
    for name, linear in block_linears(model).items():
        w_max = linear.weight.detach().abs().amax(0).clamp_min(1e-5)  # (in,)
        s = (maxima[name].clamp_min(1e-5) ** alpha / w_max ** (1 - alpha)).clamp_min(1e-5)
        linear.weight.data.mul_(s)  # W diag(s)
        parent, child = name.rsplit(".", 1)
        setattr(model.get_submodule(parent), child, Smoothed(linear, 1 / s))
    return model


def torch_ao(model: nn.Module, per_channel: bool) -> nn.Module:
    qconfig = (torch.ao.quantization.per_channel_dynamic_qconfig if per_channel
               else torch.ao.quantization.default_dynamic_qconfig)  # fmt: skip
    names = set(block_linears(model))
    with warnings.catch_warnings():  # torch.ao's notice that torchao will replace it
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model), {n: qconfig for n in names}, dtype=torch.qint8
        ).eval()


def attnlab_int8(model: nn.Module) -> nn.Module:
    from attnlab.compress.int8 import Int8Linear

    model = copy.deepcopy(model)
    for name, linear in block_linears(model).items():
        parent, child = name.rsplit(".", 1)
        setattr(model.get_submodule(parent), child, Int8Linear.from_linear(linear, "dynamic"))
    return model.eval()


def change(got: Tensor, ref: Tensor) -> dict[str, float]:
    moved = (got - ref).abs().amax(-1)  # (N,)
    return {
        "labels_changed": int((got.argmax(-1) != ref.argmax(-1)).sum()),
        "max_prob_change": float(moved.max()),
        "p99_prob_change": float(moved.quantile(0.99)),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a trained e5 / BERT classifier run folder")
    p.add_argument("--calibration", type=int, default=256,
                   help="training texts whose activations set SmoothQuant's scales")  # fmt: skip
    p.add_argument("--alphas", default="0.5,0.75", help="SmoothQuant's migration strengths")
    args = p.parse_args(argv)
    alphas = [float(a) for a in args.alphas.split(",")]

    from attnlab.infer import precision as prec
    from attnlab.infer.classifier import ClassifierRun

    torch.set_num_threads(1)
    info = machine(threads=1)
    run = ClassifierRun.load(args.run)
    base = run.model.eval()

    def probs(model: nn.Module, texts: list[str]) -> Tensor:
        return torch.cat([run.probs(model, texts[i : i + BATCH])
                          for i in range(0, len(texts), BATCH)])  # fmt: skip

    train, _, _ = run.split_texts("train")
    maxima = activation_maxima(base, probs, sorted(train[: args.calibration], key=len))
    schemes = {
        "torch.ao int8, weights per tensor (predict's int8)": torch_ao(base, False),
        "torch.ao int8, weights per channel": torch_ao(base, True),
        "attnlab int8, weights per channel, activations per token": attnlab_int8(base),
    }
    for alpha in alphas:
        schemes[f"torch.ao int8 per channel, smoothed α = {alpha:g}"] = torch_ao(
            smoothed(base, maxima, alpha), True
        )
        schemes[f"attnlab int8 per token, smoothed α = {alpha:g}"] = attnlab_int8(
            smoothed(base, maxima, alpha)
        )
    if "bf16" in prec.available():
        schemes["bf16 autocast (predict's bf16 before its re-run)"] = prec.Autocast(base).eval()
    rows: dict[str, dict] = {name: {} for name in schemes}
    for split in ("val", "test"):
        texts, _, source = run.split_texts(split)
        texts = sorted(texts, key=len)  # batches pad as little as predict's own sorting does
        ref = probs(base, texts)  # (N, C)
        for name, model in schemes.items():
            got = probs(model, texts)
            row = change(got, ref)
            if split == "test":  # a guard set on validation: twice its largest change
                guard = 2 * rows[name]["val"]["max_prob_change"]
                got_top = got.topk(2, dim=-1).values
                row["guard_margin"] = guard
                row["rerun_share"] = float(((got_top[:, 0] - got_top[:, 1]) < guard).float().mean())
            rows[name][split] = {"n": len(texts), "source": source, **row}
            print(split, name, json.dumps(row), flush=True)
    info["load_average_at_end"] = load_average()
    out = {"machine": info, "run": args.run, "calibration_texts": args.calibration,
           "schemes": rows}  # fmt: skip
    write_results(STEM, out, page(out), command_line(argv))


def page(out: dict) -> list[str]:
    lines = [
        "# Which int8 scheme keeps a classifier's labels",
        "",
        machine_line(out["machine"]),
        "",
        f"Run: `{out['run']}`. Each scheme's probabilities against float32's on the run's "
        "validation and test splits (the script's docstring defines the schemes; SmoothQuant's "
        f"scales from {out['calibration_texts']} training texts). Re-run: the share of test "
        "texts whose top two classes are within twice the scheme's largest validation change, "
        "what a float32 re-run of close calls (predict's bf16 guard) would cost it.",
        "",
        "| scheme | val: labels changed | largest change | 99th pct | test: labels changed "
        "| largest change | 99th pct | re-run at twice val's largest |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in out["schemes"].items():
        v, t = r["val"], r["test"]
        lines.append(
            f"| {name} | {v['labels_changed']} of {v['n']} | {v['max_prob_change']:.4f} | "
            f"{v['p99_prob_change']:.4f} | {t['labels_changed']} of {t['n']} | "
            f"{t['max_prob_change']:.4f} | {t['p99_prob_change']:.4f} | "
            f"{t['rerun_share']:.1%} (margin {t['guard_margin']:.3f}) |"
        )
    return lines


if __name__ == "__main__":
    main()
