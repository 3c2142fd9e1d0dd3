"""The CPU paths a classifier's forward pass may take, and the measured choice between them.

- ``fp32``: the trained model, its Linear layers run through oneDNN's float32 matmul on the CPU
  (``OneDNNLinear``: the same weights and float32 numbers; torch's own float32 Linear calls
  MKL, whose AVX2 kernels are what it runs on AMD CPUs);
- ``int8``: every ``nn.Linear`` dynamically quantized (``torch.ao.quantization.quantize_dynamic``,
  qint8 weights per tensor, activations quantized per batch at run time; fbgemm's VNNI kernels
  on this CPU), embeddings, LayerNorm, softmax and attention's two batched matmuls in float32;
- ``bf16``: the forward pass under ``torch.autocast("cpu", torch.bfloat16)`` (matmuls in
  bfloat16 with float32 accumulation, LayerNorm in float32, attention's softmax summing in
  float32), the Linear weights stored in bfloat16 once rather than cast on every call (the
  same numbers), and its close calls decided in float32 (``Guarded``: a text whose two
  likeliest classes are within ``BF16_MARGIN`` is run again through the fp32 path);
  offered only where the CPU has native bfloat16 (avx512_bf16 or AMX), as emulated bfloat16
  is slower than float32.

``choose`` takes the fastest path whose labels equal float32's on a check set: it times every
path (and, when asked to, 1 thread against every core this process may use, so threads follow
the cores that are free when it runs, not the count the machine has) on the same texts and
refuses a path that changes any label. Attention maps (``attention``, the explorer) and
``evaluate`` stay in float32: only ``predict`` takes the chosen path.
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from attnlab.layers.attention import MultiHeadAttention

PRECISIONS = ("auto", "fp32", "bf16", "int8")
CHECK_TEXTS = 64  # texts of the check set: labels compared with float32's, and timed
# bf16's close calls: a label can change only where the two classes' changes sum past their
# margin; the largest |p - p_fp32| measured on the main job's run is 0.021 (validation) and
# 0.017 (test) eager, 0.016 and 0.018 compiled (Linear weights packed by Inductor's freezing,
# attention on the matmul backend), so 0.08 leaves 1.9x room over twice the largest; 2.2-2.6%
# of its texts are re-run (benchmarks/infer/close_calls.py, docs/results/close_calls.md)
BF16_MARGIN = 0.08


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (avx512_bf16 or AMX), from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def available() -> tuple[str, ...]:
    """The paths this machine runs: fp32, int8, and bf16 where the CPU has it."""
    return ("fp32", "int8", "bf16") if cpu_has_bf16() else ("fp32", "int8")


class OneDNNLinear(nn.Module):
    """``linear`` (its own weight and bias, shared) through oneDNN's float32 matmul,
    y = x Wᵀ + b. torch's float32 ``nn.Linear`` calls MKL's sgemm, which on AMD CPUs runs its
    AVX2 kernels whatever the CPU has; oneDNN runs AVX-512 where the CPU has it (on a 2-core
    AMD EPYC with AVX-512, one thread: 2.3x MKL's GFLOP/s at e5-small's feed-forward shape,
    docs/results/throughput.md). Inference only: the op has no gradient."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias  # (out, in), (out,) or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (..., in) -> (..., out)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def sharing_copy(model: nn.Module, copied: Sequence[torch.Tensor] = ()) -> nn.Module:
    """A copy of ``model``'s modules holding ``model``'s own parameters and buffers, but for
    those in ``copied``, which are copied (ones the caller will change)."""
    own = {id(t) for t in copied}
    kept = (*model.parameters(), *model.buffers())
    return copy.deepcopy(model, memo={id(t): t for t in kept if id(t) not in own})


def onednn(model: nn.Module) -> nn.Module:
    """``model`` with every float32 ``nn.Linear`` on the CPU run by :class:`OneDNNLinear`,
    sharing every tensor with ``model`` (no weight is copied); ``model`` itself where torch was
    built without oneDNN or the model is not float32 on the CPU."""
    weight = next(model.parameters(), None)
    if (not torch.backends.mkldnn.is_available() or weight is None
            or weight.device.type != "cpu" or weight.dtype != torch.float32):  # fmt: skip
        return model
    copied = sharing_copy(model)
    for module in list(copied.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, OneDNNLinear(child))
    return copied.eval()


class Autocast(nn.Module):
    """A copy of ``model`` with its Linear layers in bfloat16, run under CPU bfloat16 autocast;
    logits returned as float32. Autocast casts a float32 weight to bfloat16 on every call; the
    copy holds that cast once, so the numbers are autocast's and the casts are gone; every
    other tensor (the embeddings, most of e5's weights) is shared with ``model``, not copied.
    Its full attention takes the ``matmul`` backend, which runs bfloat16 rows of up to 256 keys
    faster than torch's flash kernel (longer rows stay on the fused kernel)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        cast = [t for m in model.modules() if isinstance(m, nn.Linear)
                for t in m.parameters(recurse=False)]  # copied: .to() rewrites them in place
        self.model = sharing_copy(model, cast)
        for module in self.model.modules():
            if isinstance(module, nn.Linear):
                module.to(torch.bfloat16)
            if isinstance(module, MultiHeadAttention) and module.backend == "fused":
                module.backend = "matmul"

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(*args, **kwargs).float()  # (B, C)


class Guarded(nn.Module):
    """``fast`` with its close calls decided by ``reference``: a text whose two likeliest classes
    are within ``margin`` of each other on the fast path is run again through ``reference``
    (float32). Where every |p - p_ref| of a text stays under ``margin`` / 2, its label is the
    reference's. ``rerun`` counts the texts run again (and ``seen`` all texts)."""

    def __init__(self, fast: nn.Module, reference: nn.Module, margin: float) -> None:
        super().__init__()
        self.fast, self.reference, self.margin = fast, reference, margin
        self.seen = self.rerun = 0

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        logits = self.fast(ids, lengths).float()  # (B, C)
        top = logits.softmax(-1).topk(2, dim=-1).values  # (B, 2)
        close = (top[:, 0] - top[:, 1]) < self.margin  # (B,)
        self.seen += len(ids)
        if close.any():
            width = int(lengths[close].max())  # ids are padded on the right
            logits[close] = self.reference(ids[close][:, :width], lengths[close]).float()
            self.rerun += int(close.sum())
        return logits


class Compiled(nn.Module):
    """``model`` through ``torch.compile`` (Inductor, shapes dynamic, the weights frozen into
    the graph as constants): each Linear becomes oneDNN's linear on a weight packed once, with
    a following GELU fused into it, and the elementwise steps between the matmuls (LayerNorm,
    the casts and residual adds) fuse into generated C++. Freezing is Inductor's global setting,
    held here around every call: Dynamo reads it when it traces (to keep the weights as
    constants rather than graph inputs), so ``torch.compile(options={"freezing": True})`` alone
    packs nothing. A batch of one runs as that text twice, so the graph compiled for batches
    serves it: torch specialises a dimension of size 1, which would compile a second graph on a
    first lone text. The graph is kept for the thread count it was compiled on: another count
    compiles again."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.compiled = torch.compile(model, dynamic=True)

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        from torch._inductor import config as inductor_config  # a second to import: only here

        with inductor_config.patch(freezing=True):
            if len(ids) == 1:
                return self.compiled(ids.repeat(2, 1), lengths.repeat(2))[:1]  # (1, C)
            return self.compiled(ids, lengths)  # (B, C)


def compile_missing() -> str | None:
    """Why ``torch.compile`` cannot build its CPU kernels here (no C++ compiler), or None."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    try:
        get_cpp_compiler()
    except Exception as err:  # noqa: BLE001 - torch raises its own kinds; the line names it
        return f"torch.compile needs a C++ compiler (g++ or clang++, or $CXX): {err}"
    return None


def compiled(path: nn.Module, model: nn.Module) -> nn.Module:
    """``path`` (``convert(model, ...)``) with its fast part compiled: a guarded path compiles
    the bf16 pass and keeps the float32 re-run eager (it sees a few texts); the fp32 path
    compiles ``model`` itself, whose plain Linear layers Inductor packs for oneDNN."""
    if isinstance(path, Guarded):
        path.fast = Compiled(path.fast)
        return path
    return Compiled(model)


def convert(model: nn.Module, precision: str) -> nn.Module:
    """``model`` for the ``precision`` path; ``model`` is left untouched (fp32 returns it itself
    where oneDNN does not apply: see :func:`onednn`)."""
    if precision == "fp32":
        return onednn(model)
    if precision == "bf16":
        return Guarded(Autocast(model).eval(), onednn(model), BF16_MARGIN).eval()
    if precision == "int8":
        with warnings.catch_warnings():  # torch.ao's notice that torchao will replace it
            warnings.simplefilter("ignore")
            quantized = torch.ao.quantization.quantize_dynamic(
                copy.deepcopy(model).cpu(), {nn.Linear}, dtype=torch.qint8
            )
        return quantized.eval()
    raise ValueError(f"unknown precision {precision!r}; use one of {PRECISIONS}")


@dataclass
class Trial:
    """One path timed on the check set."""

    precision: str
    threads: int
    texts_per_s: float
    labels_changed: int  # of the check set's texts, against float32 on its thread count
    max_prob_change: float  # largest |p - p_fp32| over texts and classes


@dataclass
class Choice:
    """The path taken, and why."""

    precision: str
    threads: int
    reason: str
    trials: list[Trial] = field(default_factory=list)
    compiled: bool = False  # run through torch.compile

    @property
    def name(self) -> str:
        """The path as one name: "bf16", "bf16 compiled"."""
        return self.precision + " compiled" * self.compiled


Predict = Callable[[nn.Module, list[str]], torch.Tensor]  # (model, texts) -> probs (N, C)


def _time(predict: Predict, model: nn.Module, texts: list[str], threads: int) -> tuple:
    """(texts/s, probs (N, C)): the best of two passes on ``threads`` threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        predict(model, texts[:4])  # warm-up: first-call allocations, kernels chosen
        best, probs = float("inf"), None
        for _ in range(2):
            start = time.perf_counter()
            probs = predict(model, texts)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return len(texts) / best, probs


def choose(
    model: nn.Module,
    predict: Predict,
    texts: Sequence[str],
    paths: Sequence[str],
    threads: Sequence[int],
) -> tuple[Choice, dict[str, nn.Module]]:
    """Time every path in ``paths`` on every thread count in ``threads`` over ``texts`` and
    take the fastest whose labels all equal float32's; returns the choice and the converted
    models by path."""
    texts = list(texts)
    models = {p: convert(model, p) for p in dict.fromkeys(("fp32", *paths))}
    trials: list[Trial] = []
    reference = None
    for n in threads:
        for p in models:
            rate, probs = _time(predict, models[p], texts, n)
            if reference is None:
                reference = probs
            changed = int((probs.argmax(-1) != reference.argmax(-1)).sum())
            change = float((probs - reference).abs().max())
            trials.append(Trial(p, n, rate, changed, change))
    kept = [t for t in trials if t.labels_changed == 0 and t.precision in paths]
    best = max(kept or [t for t in trials if t.precision == "fp32"], key=lambda t: t.texts_per_s)
    fp32 = next(t for t in trials if t.precision == "fp32" and t.threads == best.threads)
    others = ", ".join(f"{t.precision}/{t.threads}t {t.texts_per_s:.0f}"
                       + (f" (changed {t.labels_changed} labels)" if t.labels_changed else "")
                       for t in trials if t is not best)  # fmt: skip
    reason = (
        f"{best.precision} on {best.threads} thread(s): {best.texts_per_s:.0f} texts/s against "
        f"fp32's {fp32.texts_per_s:.0f} on {len(texts)} check texts, labels equal to fp32's, "
        f"probabilities within {best.max_prob_change:.4f} (also timed: {others})"
    )
    return Choice(best.precision, best.threads, reason, trials), models
