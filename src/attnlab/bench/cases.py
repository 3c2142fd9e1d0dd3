"""Steps measured in a fresh process (:mod:`attnlab.bench.memory`): attention, a block, a GPT."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnlab.errors import UserError
from attnlab.layers.attention import MultiHeadAttention
from attnlab.layers.blocks import Block, BlockConfig
from attnlab.models.gpt import GPT, GPTConfig

Step = Callable[[], None]

# kinds of the scaling benchmark: full attention by a backend, or local or linear attention
BACKEND_KINDS = ("explicit", "fused", "flash")
BLOCK_KINDS = (*BACKEND_KINDS, "local", "linear")


def block(kind: str, d_model: int, n_heads: int, window: int) -> Block:
    """A pre-norm causal GPT block, d_ff = 4·d_model, no dropout, with ``kind`` attention."""
    if kind not in BLOCK_KINDS:
        raise UserError(f"unknown block kind {kind!r}; one of {', '.join(BLOCK_KINDS)}")
    attention, backend = ("full", kind) if kind in BACKEND_KINDS else (kind, "fused")
    cfg = BlockConfig(
        d_model,
        n_heads,
        4 * d_model,
        dropout=0.0,
        activation="gelu",
        norm_position="pre",
        backend=backend,
        attention=attention,
        window=window if attention == "local" else 0,
    )
    return Block(cfg)


def _block_steps(spec: dict, device: torch.device) -> tuple[Step, Step]:
    torch.manual_seed(0)
    d = spec["d_model"]
    model = block(spec["kind"], d, spec["n_heads"], spec["window"]).to(device)

    def make(T: int) -> Step:
        x = torch.randn(spec["batch"], T, d, device=device, requires_grad=True)
        cot = torch.randn(spec["batch"], T, d, device=device)

        def step() -> None:
            out, _ = model(x, is_causal=True)  # (B, T, D)
            out.backward(cot)
            x.grad = None
            model.zero_grad(set_to_none=True)

        return step

    return make(min(spec["T"], 256)), make(spec["T"])


def _gpt_steps(spec: dict, device: torch.device) -> tuple[Step, Step]:
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=spec["vocab"],
        context=spec["context"],
        n_layers=spec["n_layers"],
        n_heads=spec["n_heads"],
        d_model=spec["d_model"],
        gradient_checkpointing=spec["checkpointing"],
    )
    model = GPT(cfg).to(device).train()

    def make(batch: int) -> Step:
        ids = torch.randint(0, cfg.vocab_size, (batch, cfg.context), device=device)

        def step() -> None:
            logits = model(ids)  # (B, T, V)
            F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
            model.zero_grad(set_to_none=True)

        return step

    return make(1), make(spec["batch"])


def _attention_steps(spec: dict, device: torch.device) -> tuple[Step, Step]:
    """Causal attention alone, forward + backward, q, k, v (B, H, T, d) float32: ``kind`` is
    explicit (the T×T path), fused (F.scaled_dot_product_attention) or flash (attnlab.layers.flash,
    with tiles of ``spec["block"]``)."""
    from attnlab.layers.attention import explicit_attention
    from attnlab.layers.flash import flash_attention

    kernels = {
        "explicit": lambda q, k, v: explicit_attention(q, k, v, is_causal=True)[0],
        "fused": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "flash": lambda q, k, v: flash_attention(
            q, k, v, is_causal=True, block_q=spec["block"], block_k=spec["block"]
        ),
    }
    attend = kernels[spec["kind"]]
    torch.manual_seed(0)

    def make(T: int) -> Step:
        shape = (spec["batch"], spec["n_heads"], T, spec["head_dim"])
        q, k, v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))
        cot = torch.randn(shape, device=device)

        def step() -> None:
            attend(q, k, v).backward(cot)  # (B, H, T, d)
            q.grad = k.grad = v.grad = None

        return step

    return make(min(spec["T"], 256)), make(spec["T"])


def _mha_steps(spec: dict, device: torch.device) -> tuple[Step, Step]:
    """MultiHeadAttention forward + backward on its ``path``, a backend: "explicit" or "fused"."""
    torch.manual_seed(0)
    d = spec["d_model"]
    mha = MultiHeadAttention(d, spec["n_heads"], backend=spec["path"]).to(device)

    def make(B: int, T: int) -> Step:
        x = torch.randn(B, T, d, device=device, requires_grad=True)
        cot = torch.ones(B, T, d, device=device)

        def step() -> None:
            out, _ = mha(x, is_causal=spec["causal"])  # (B, T, D)
            out.backward(cot)

        return step

    return make(1, 64), make(spec["B"], spec["T"])


def build_case(spec: dict, device: torch.device) -> tuple[Step, Step]:
    """(warm-up step, measured step) for ``spec["case"]`` in {"mha", "block", "gpt",
    "attention"}."""
    builders = {
        "mha": _mha_steps,
        "block": _block_steps,
        "gpt": _gpt_steps,
        "attention": _attention_steps,
    }
    if spec["case"] not in builders:
        raise UserError(f"unknown case {spec['case']!r}; one of {', '.join(builders)}")
    return builders[spec["case"]](spec, device)
