"""Page data of vision runs: ViT attention over patches, CNN channel and spatial gates.

ViT: every layer's self-attention over ``[cls] + patches`` (the page draws the class token's row
over the image, or for mean pooling the mean of all rows) and the rollout map. CNN: for each
residual block with an attention module, the gate it multiplies the features with: SE and ECA
channel weights, CBAM's channel weights and spatial map, coordinate attention's row and column
gates (and their channel-averaged product as a map).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnlab.data.images import normalize
from attnlab.errors import UserError
from attnlab.explore.pack import build_group, calls_named, f32, u8
from attnlab.explore.sources import Source
from attnlab.layers.attention_record import record_attention
from attnlab.layers.channel import CBAM, ECA, CoordinateAttention, SqueezeExcite
from attnlab.models.swin import Swin
from attnlab.models.vit import attention_rollout

DEFAULT_IMAGES = 4


def load_images(source: Source, paths: list[str]) -> tuple[Tensor, list[str]]:
    """uint8 images (B, C, H, W) and their names: the files given, else test-split images."""
    run = source.run
    if paths:
        return run.load_images(paths), list(paths)
    from attnlab.data.image_splits import load_splits

    test = load_splits(run.config.data)[0]["test"]
    n = min(DEFAULT_IMAGES, len(test))
    names = [f"test image {i} ({test.classes[int(test.labels[i])]})" for i in range(n)]
    return test.images[:n], names


def _image(pixels: Tensor) -> dict[str, Any]:
    c, h, w = pixels.shape
    return {"channels": c, "height": h, "width": w, "pixels": u8(pixels.permute(1, 2, 0))}


def _prediction(run: Any, logits: Tensor) -> dict[str, Any]:
    probs = torch.softmax(logits.float(), dim=-1)
    k = int(probs.argmax())
    return {
        "label": run.classes[k],
        "probs": {name: float(probs[i]) for i, name in enumerate(run.classes)},
    }


@torch.no_grad()
def vit_examples(source: Source, paths: list[str]) -> dict[str, Any]:
    """One example per image: attention of every layer and head, rollout, prediction."""
    run = source.run
    model = run.model
    if isinstance(model, Swin):  # windows instead of one sequence
        return swin_examples(source, paths)
    images, names = load_images(source, paths)
    x = normalize(images, run.report["mean"], run.report["std"])
    with record_attention(model) as rec:
        info = model.inspect(x)
    calls = calls_named(rec.calls, "self_attn")
    cfg = model.cfg
    g, cls = cfg.grid, cfg.pooling == "cls"
    prefix = (["[cls]"] if cls else []) + (["[dist]"] if getattr(cfg, "distill", False) else [])
    tokens = prefix + [f"p{r},{c}" for r in range(g) for c in range(g)]
    roll = attention_rollout(info["attention"])  # (B, T, T)
    examples = []
    for b, name in enumerate(names):
        share = roll[b, 0, len(prefix) :] if cls else roll[b].mean(dim=0)  # (N,)
        examples.append(
            {
                "input": name,
                "groups": [build_group("self-attention", calls, b, tokens, tokens)],
                "prediction": _prediction(run, info["logits"][b]),
                "image": _image(images[b]),
                "patches": {
                    "grid": g,
                    "cls": cls,
                    "rollout": f32(share / share.sum()),
                    "note": (
                        "the class token's attention over the patches"
                        if cls
                        else "mean pooling: the mean attention each patch receives over all rows"
                    ),
                },
            }
        )
    title = (
        f"ViT {source.name} · {cfg.n_layers} layers × {cfg.n_heads} heads · "
        f"{g}×{g} patches of {cfg.patch_size}px"
    )
    return {"title": title, "examples": examples}


@torch.no_grad()
def swin_examples(source: Source, paths: list[str]) -> dict[str, Any]:
    """One example per image: each block's window attention spread over the token grid (one
    group per block, so plain and shifted windows show as different masks), the attention
    each first-stage token receives, the prediction."""
    from attnlab.layers.attention_record import AttentionCall
    from attnlab.models.swin import attention_received, dense_window_attention

    run = source.run
    model = run.model
    images, names = load_images(source, paths)
    x = normalize(images, run.report["mean"], run.report["std"])
    info = model.inspect(x)
    blocks = [(i, j, b) for i, st in enumerate(model.stages) for j, b in enumerate(st.blocks)]
    received = attention_received(model, x)  # (B, G, G)
    groups: list[list[dict[str, Any]]] = [[] for _ in names]
    for (i, j, block), w in zip(blocks, info["attention"]):
        dense, mask = dense_window_attention(block, w)  # (B, H, R², R²), (R², R²)
        R = block.resolution
        tokens = [f"s{i + 1} p{r},{c}" for r in range(R) for c in range(R)]
        call = AttentionCall(
            "self_attn", torch.zeros_like(dense), 1.0, None, mask[None, None], False, dense
        )
        how = f"shifted by {block.shift}" if block.shift else "not shifted"
        label = f"stage {i + 1} block {j + 1}: {block.window}×{block.window} windows, {how}"
        for b in range(len(names)):
            group = build_group(label, [call], b, tokens, tokens)
            group.update(scores=None, bias=None, scores_note="window attention: weights only")
            groups[b].append(group)
    g = model.stages[0].resolution
    examples = [
        {
            "input": name,
            "groups": groups[b],
            "prediction": _prediction(run, info["logits"][b]),
            "image": _image(images[b]),
            "patches": {
                "grid": g,
                "cls": False,
                "rollout": f32(received[b].flatten()),
                "note": "attention each first-stage token receives (mean over its window)",
            },
        }
        for b, name in enumerate(names)
    ]
    cfg = model.cfg
    title = (
        f"Swin {source.name} · stages {list(cfg.depths)} · heads {list(cfg.stage_heads)} · "
        f"window {cfg.window} · {g}×{g} tokens of {cfg.patch_size}px"
    )
    return {"title": title, "examples": examples}


@torch.no_grad()
def cnn_examples(source: Source, paths: list[str]) -> dict[str, Any]:
    """One example per image: the attention gates of every residual block."""
    run = source.run
    model: nn.Module = run.model
    images, names = load_images(source, paths)
    x = normalize(images, run.report["mean"], run.report["std"])
    inputs: dict[str, Tensor] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, SqueezeExcite | ECA | CBAM | CoordinateAttention):
            hooks.append(module.register_forward_pre_hook(_keep_input(inputs, name)))
    try:
        logits = model(x)  # (B, classes)
    finally:
        for hook in hooks:
            hook.remove()
    if not inputs:
        raise UserError(
            f"{source.name} is a CNN without attention (channel_attention = none): nothing "
            "to explore; train one with --channel-attention se, eca, cbam or ca"
        )
    modules = dict(model.named_modules())
    examples = []
    for b, name in enumerate(names):
        gates = [_gates(block, modules[block], feats[b : b + 1]) for block, feats in inputs.items()]
        examples.append(
            {
                "input": name,
                "groups": [],
                "prediction": _prediction(run, logits[b]),
                "image": _image(images[b]),
                "gates": gates,
            }
        )
    cfg = run.config.model
    title = f"CNN {source.name} · {cfg.stages} stages × {cfg.blocks_per_stage} blocks · "
    title += f"attention {cfg.channel_attention}"
    return {"title": title, "examples": examples}


def _keep_input(store: dict[str, Tensor], name: str):
    def hook(module: nn.Module, args: tuple[Tensor, ...]) -> None:
        store[name] = args[0]

    return hook


def _gates(name: str, module: nn.Module, x: Tensor) -> dict[str, Any]:
    """What one attention module multiplies its input x (1, C, H, W) with."""
    _, C, H, W = x.shape
    out: dict[str, Any] = {"block": name.removesuffix(".attention"), "channels": C, "h": H, "w": W}
    if isinstance(module, SqueezeExcite | ECA):
        out["kind"] = "SE" if isinstance(module, SqueezeExcite) else "ECA"
        out["channel"] = module.gate(x)[0, :, 0, 0].tolist()  # (C,)
    elif isinstance(module, CBAM):
        mc = module.channel(x)  # (1, C, 1, 1)
        out["kind"] = "CBAM"
        out["channel"] = mc[0, :, 0, 0].tolist()
        out["spatial"] = f32(module.spatial(x * mc)[0, 0])  # (H, W)
    else:
        g_h, g_w = module.gates(x)  # (1, C, H, 1), (1, C, 1, W)
        out["kind"] = "coordinate attention"
        out["rows"] = g_h[0, :, :, 0].mean(dim=0).tolist()  # (H,) mean over channels
        out["cols"] = g_w[0, :, 0, :].mean(dim=0).tolist()  # (W,)
        out["spatial"] = f32((g_h * g_w)[0].mean(dim=0))  # (H, W)
    return out
