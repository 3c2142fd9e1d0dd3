"""Parity checks of the vision models beyond the ViT: Swin, DeiT and MAE against Hugging Face.

Each builds a tiny random HF configuration, randomises every HF parameter (far from init, so a
transposed or swapped tensor shows), copies the weights into attnlab's model by name and
compares hidden states, attention and outputs. float64 with HF's ``sdpa`` attention where HF
then computes in the input's dtype (its eager path softmaxes in float32); float32 with eager
attention where the attention weights themselves are compared.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from attnlab.models.mae import MAE, MAEConfig
from attnlab.models.swin import Swin, SwinConfig
from attnlab.models.vit import DeiT, ViTConfig
from attnlab.verify.check import Measure
from attnlab.verify.checks_hf import _transformers
from attnlab.verify.checks_torch import choice, randint

F64 = torch.float64


def randomise(model: nn.Module, std: float = 0.3) -> nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std) if p.dim() >= 2 else p.normal_(1.0, std)
    return model


def _attention(src: dict[str, Tensor], ours: str, theirs: str, kind: str) -> dict[str, Tensor]:
    """attnlab's q_proj and kv_proj (keys then values) from HF's q/k/v projections."""
    return {
        f"{ours}q_proj.{kind}": src[f"{theirs}q_proj.{kind}"],
        f"{ours}kv_proj.{kind}": torch.cat([src[f"{theirs}{x}_proj.{kind}"] for x in "kv"]),
    }


def swin_state_dict(model: Swin, hf: nn.Module) -> dict[str, Tensor]:
    """attnlab Swin weights from HF ``SwinForImageClassification`` (transformers 5 names)."""
    src = {k.removeprefix("swin."): v for k, v in hf.state_dict().items()}
    sd = {
        "patch_embed.proj.weight": src["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": src["embeddings.patch_embeddings.projection.bias"],
        "embed_norm.weight": src["embeddings.norm.weight"],
        "embed_norm.bias": src["embeddings.norm.bias"],
        "norm.weight": src["layernorm.weight"],
        "norm.bias": src["layernorm.bias"],
        "head.weight": src["classifier.weight"],
        "head.bias": src["classifier.bias"],
    }
    names = {
        "norm1": "layernorm_before",
        "norm2": "layernorm_after",
        "self_attn.out_proj": "attention.o_proj",
        "ff.w_in": "mlp.fc1",
        "ff.w_out": "mlp.fc2",
    }
    for i, stage in enumerate(model.stages):
        for j in range(len(stage.blocks)):
            ours, theirs = f"stages.{i}.blocks.{j}.", f"encoder.layers.{i}.blocks.{j}."
            for kind in ("weight", "bias"):
                sd.update(_attention(src, ours + "self_attn.", theirs + "attention.", kind))
                for a, b in names.items():
                    sd[ours + f"{a}.{kind}"] = src[theirs + f"{b}.{kind}"]
            table = "attention.relative_position_bias.relative_position_bias_table"
            sd[ours + "rel_bias.table"] = src[theirs + table]
        if stage.merge is not None:
            down = f"encoder.layers.{i}.downsample."
            sd[f"stages.{i}.merge.reduction.weight"] = src[down + "reduction.weight"]
            sd[f"stages.{i}.merge.norm.weight"] = src[down + "norm.weight"]
            sd[f"stages.{i}.merge.norm.bias"] = src[down + "norm.bias"]
    return sd


def hf_swin_config(cfg: SwinConfig, attn: str) -> Any:
    return _transformers().SwinConfig(
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
        num_channels=cfg.in_channels,
        embed_dim=cfg.d_model,
        depths=list(cfg.depths),
        num_heads=list(cfg.stage_heads),
        window_size=cfg.window,
        mlp_ratio=cfg.mlp_ratio,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
        hidden_act="gelu",
        layer_norm_eps=cfg.norm_eps,
        num_labels=cfg.n_classes,
        attn_implementation=attn,
    )


# Shapes HF can run: a stage's grid must be >= the window (HF keeps the window's bias table
# when it clamps), unless it equals it; (image, patch, window, depths) with stage grids.
SWIN_SHAPES = [
    (16, 2, 4, (2, 2)),  # 8x8 (shifted, 4 windows) -> 4x4 (one window, no shift)
    (20, 2, 4, (2, 2)),  # 10x10 padded to 12 and shifted -> 5x5 padded to 8 and shifted
    (12, 1, 3, (2, 1)),  # 12x12, 16 windows shifted by 1 -> 6x6
    (24, 2, 3, (1, 2, 2)),  # three stages: 12x12 -> 6x6 -> 3x3
]


def random_swin_config(shape: tuple) -> SwinConfig:
    image, patch, window, depths = shape
    heads = choice([1, 2])
    return SwinConfig(
        image_size=image,
        in_channels=choice([1, 3]),
        patch_size=patch,
        d_model=heads * 2 * randint(2, 4),
        depths=depths,
        stage_heads=tuple(heads * 2**i for i in range(len(depths))),
        window=window,
        mlp_ratio=choice([1.0, 2.0]),
        dropout=0.0,
        n_classes=randint(2, 5),
    )


def check_swin(m: Measure, f64: bool = True) -> None:
    """SwinForImageClassification == attnlab's Swin: the stem, every stage's output (after
    patch merging), the final states, the pooled output and the logits; float64 through HF's
    sdpa path, or float32 through its eager path with every block's attention weights too."""
    tf = _transformers()
    for shape in SWIN_SHAPES:
        cfg = random_swin_config(shape)
        hf = tf.SwinForImageClassification(hf_swin_config(cfg, "sdpa" if f64 else "eager"))
        randomise(hf).eval()
        model = Swin(cfg).eval()
        model.load_state_dict(swin_state_dict(model, hf), strict=True)
        images = torch.randn(randint(1, 3), cfg.in_channels, cfg.image_size, cfg.image_size)
        if f64:
            hf, model, images = hf.to(F64), model.to(F64), images.to(F64)
        with torch.no_grad():
            ref = hf.swin(images, output_hidden_states=True, output_attentions=not f64)
            ref_logits = hf(images).logits
            ours = model.inspect(images)
        B = images.shape[0]
        for a, b in zip(ours["hidden_states"], ref.reshaped_hidden_states, strict=True):
            m.diff(a, b.flatten(2).transpose(1, 2), "stage output")
        m.diff(ours["last_hidden_state"], ref.last_hidden_state, "last hidden state")
        m.diff(ours["last_hidden_state"].mean(1), ref.pooler_output, "pooled")
        m.diff(ours["logits"], ref_logits, "logits")
        if not f64:  # HF returns the last block's attention of each stage, (B·nW, H, M², M²)
            last = [w for k, w in enumerate(ours["attention"]) if _last_of_stage(model, k)]
            for a, b in zip(last, ref.attentions, strict=True):
                m.diff(a.reshape(-1, *a.shape[2:]), b, "attention")
            assert all(w.shape[0] == B for w in ours["attention"])
        m.case()


def _last_of_stage(model: Swin, k: int) -> bool:
    ends, n = set(), 0
    for stage in model.stages:
        n += len(stage.blocks)
        ends.add(n - 1)
    return k in ends


def check_swin_f32(m: Measure) -> None:
    check_swin(m, f64=False)


# --------------------------------------------------------------------------- DeiT


def deit_state_dict(model: DeiT, hf: nn.Module) -> dict[str, Tensor]:
    """attnlab DeiT weights from HF ``DeiTForImageClassificationWithTeacher``."""
    src = {k.removeprefix("deit."): v for k, v in hf.state_dict().items()}
    sd = {
        "cls_token": src["embeddings.cls_token"],
        "dist_token": src["embeddings.distillation_token"],
        "pos_embed.embedding.weight": src["embeddings.position_embeddings"][0],
        "patch_embed.proj.weight": src["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": src["embeddings.patch_embeddings.projection.bias"],
        "encoder.norm.weight": src["layernorm.weight"],
        "encoder.norm.bias": src["layernorm.bias"],
        "head.weight": src["cls_classifier.weight"],
        "head.bias": src["cls_classifier.bias"],
        "head_dist.weight": src["distillation_classifier.weight"],
        "head_dist.bias": src["distillation_classifier.bias"],
    }
    sd.update(_vit_layers(src, model.cfg.n_layers, "encoder.blocks.", "layers."))
    return sd


def _vit_layers(src: dict[str, Tensor], n: int, ours: str, theirs: str) -> dict[str, Tensor]:
    """Pre-norm encoder layers in HF ViT/DeiT/ViTMAE names (transformers 5) -> attnlab's."""
    names = {
        "self_attn.out_proj": "attention.o_proj",
        "ff.w_in": "mlp.fc1",
        "ff.w_out": "mlp.fc2",
        "norm1": "layernorm_before",
        "norm2": "layernorm_after",
    }
    sd = {}
    for i in range(n):
        a, b = f"{ours}{i}.", f"{theirs}{i}."
        for kind in ("weight", "bias"):
            sd.update(_attention(src, a + "self_attn.", b + "attention.", kind))
            for x, y in names.items():
                sd[a + f"{x}.{kind}"] = src[b + f"{y}.{kind}"]
    return sd


def check_deit(m: Measure, cases: int = 3) -> None:
    """DeiTForImageClassificationWithTeacher == attnlab's DeiT: every hidden state, the class
    and distillation logits and their mean, float64 (HF's sdpa path)."""
    tf = _transformers()
    for _ in range(cases):
        H, patch = randint(1, 3), choice([2, 4])
        cfg = ViTConfig(
            image_size=patch * randint(1, 4),
            in_channels=choice([1, 3]),
            patch_size=patch,
            d_model=H * randint(2, 6),
            n_layers=randint(1, 2),
            n_heads=H,
            d_ff=randint(8, 32),
            dropout=0.0,
            norm_eps=1e-12,
            distill=True,
            n_classes=randint(2, 5),
        )
        hf_cfg = tf.DeiTConfig(
            hidden_size=cfg.d_model,
            num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads,
            intermediate_size=cfg.d_ff,
            hidden_act="gelu",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            image_size=cfg.image_size,
            patch_size=cfg.patch_size,
            num_channels=cfg.in_channels,
            layer_norm_eps=cfg.norm_eps,
            num_labels=cfg.n_classes,
            attn_implementation="sdpa",
        )
        hf = randomise(tf.DeiTForImageClassificationWithTeacher(hf_cfg)).eval().to(F64)
        model = DeiT(cfg).eval()
        model.load_state_dict(deit_state_dict(model, hf), strict=True)
        model = model.to(F64)
        images = torch.randn(randint(1, 3), cfg.in_channels, cfg.image_size, cfg.image_size)
        images = images.to(F64)
        with torch.no_grad():
            ref = hf(images, output_hidden_states=True)
            ours = model.inspect(images)
            cls_logits, dist_logits = model.heads(ours["last_hidden_state"])
        for a, b in zip(ours["hidden_states"], ref.hidden_states, strict=True):
            m.diff(a, b, "hidden state")
        m.diff(cls_logits, ref.cls_logits, "class head")
        m.diff(dist_logits, ref.distillation_logits, "distillation head")
        m.diff(ours["logits"], ref.logits, "logits")
        m.case()


# --------------------------------------------------------------------------- MAE


def mae_state_dict(model: MAE, hf: nn.Module) -> dict[str, Tensor]:
    """attnlab MAE weights from HF ``ViTMAEForPreTraining``; the ViT head (unused by MAE) keeps
    its own values. The fixed position tables are buffers here and are set by the caller."""
    src = {k.removeprefix("vit."): v for k, v in hf.state_dict().items()}
    sd = {
        "encoder.cls_token": src["embeddings.cls_token"],
        "encoder.patch_embed.proj.weight": src["embeddings.patch_embeddings.projection.weight"],
        "encoder.patch_embed.proj.bias": src["embeddings.patch_embeddings.projection.bias"],
        "encoder.encoder.norm.weight": src["layernorm.weight"],
        "encoder.encoder.norm.bias": src["layernorm.bias"],
        "encoder.head.weight": model.encoder.head.weight.detach(),
        "encoder.head.bias": model.encoder.head.bias.detach(),
        "mask_token": src["decoder.mask_token"],
        "decoder_embed.weight": src["decoder.decoder_embed.weight"],
        "decoder_embed.bias": src["decoder.decoder_embed.bias"],
        "decoder.norm.weight": src["decoder.decoder_norm.weight"],
        "decoder.norm.bias": src["decoder.decoder_norm.bias"],
        "decoder_pred.weight": src["decoder.decoder_pred.weight"],
        "decoder_pred.bias": src["decoder.decoder_pred.bias"],
    }
    sd.update(_vit_layers(src, model.cfg.n_layers, "encoder.encoder.blocks.", "layers."))
    layers = model.cfg.decoder_layers
    sd.update(_vit_layers(src, layers, "decoder.blocks.", "decoder.decoder_layers."))
    return sd


def copy_mae(model: MAE, hf: nn.Module) -> None:
    """Every HF tensor into attnlab's MAE, the two fixed sin-cos tables included (HF lays the
    channels out [sin|cos] per axis, attnlab interleaves them: the same values permuted)."""
    model.load_state_dict(mae_state_dict(model, hf), strict=True)
    with torch.no_grad():
        model.encoder.pos_embed.table.copy_(hf.vit.embeddings.position_embeddings[0])
        model.decoder_pos.table.copy_(hf.decoder.decoder_pos_embed[0])


def check_mae(m: Measure, cases: int = 3) -> None:
    """ViTMAEModel / ViTMAEForPreTraining == attnlab's MAE with the same noise: the mask and
    restore order, the encoder's hidden states and output, the decoder's per-patch predictions
    and the loss (with and without per-patch normalised targets), float64 (sdpa), and every
    parameter gradient of the loss."""
    tf = _transformers()
    for _ in range(cases):
        H, Hd, patch = randint(1, 2), randint(1, 2), choice([2, 4])
        cfg = MAEConfig(
            image_size=patch * randint(2, 4),
            in_channels=choice([1, 3]),
            patch_size=patch,
            d_model=4 * H * randint(1, 2),
            n_layers=randint(1, 2),
            n_heads=H,
            d_ff=randint(8, 24),
            decoder_d_model=4 * Hd * randint(1, 2),
            decoder_layers=randint(1, 2),
            decoder_heads=Hd,
            decoder_d_ff=randint(8, 24),
            mask_ratio=choice([0.75, 0.5]),
            norm_pix_loss=choice([True, False]),
            norm_eps=1e-12,
        )
        hf_cfg = tf.ViTMAEConfig(
            hidden_size=cfg.d_model,
            num_hidden_layers=cfg.n_layers,
            num_attention_heads=cfg.n_heads,
            intermediate_size=cfg.d_ff,
            decoder_hidden_size=cfg.decoder_d_model,
            decoder_num_hidden_layers=cfg.decoder_layers,
            decoder_num_attention_heads=cfg.decoder_heads,
            decoder_intermediate_size=cfg.decoder_d_ff,
            hidden_act="gelu",
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            image_size=cfg.image_size,
            patch_size=cfg.patch_size,
            num_channels=cfg.in_channels,
            layer_norm_eps=cfg.norm_eps,
            mask_ratio=cfg.mask_ratio,
            norm_pix_loss=cfg.norm_pix_loss,
            attn_implementation="sdpa",
        )
        hf = tf.ViTMAEForPreTraining(hf_cfg).eval()
        with torch.no_grad():  # randomise all but the fixed position tables
            for p in hf.parameters():
                if p.requires_grad:
                    p.normal_(0.0, 0.3) if p.dim() >= 2 else p.normal_(1.0, 0.3)
        hf = hf.to(F64)
        model = MAE(cfg).eval()
        copy_mae(model, hf)
        model = model.to(F64)
        n = (cfg.image_size // cfg.patch_size) ** 2
        images = torch.randn(randint(1, 3), cfg.in_channels, cfg.image_size, cfg.image_size)
        images, noise = images.to(F64), torch.rand(images.shape[0], n, dtype=F64)
        ref = hf(images, noise=noise, output_hidden_states=True)
        enc = hf.vit(images, noise=noise, output_hidden_states=True)
        ours = model(images, noise)
        if not torch.equal(ours["mask"], ref.mask.to(F64)):
            m.fail("mask differs")
        m.diff(ours["latent"], enc.last_hidden_state, "encoder output")
        m.diff(ours["pred"], ref.logits, "decoder predictions")
        m.diff(ours["loss"], ref.loss, "loss")
        ours["loss"].backward()
        ref.loss.backward()
        theirs = {k: p.grad for k, p in hf.named_parameters() if p.requires_grad}
        grads = mae_state_dict(model, _Grads(theirs, hf))
        for name, p in model.named_parameters():
            if name.startswith("encoder.head."):
                continue
            m.diff(p.grad, grads[name], f"gradient of {name}")
        m.case()


class _Grads(nn.Module):
    """Stands in for the HF model so that :func:`mae_state_dict` maps gradients, not weights."""

    def __init__(self, grads: dict[str, Tensor], hf: nn.Module) -> None:
        super().__init__()
        self._grads = grads
        self.hf = hf

    def state_dict(self, *args, **kwargs):  # noqa: ANN002, ANN003 - mirrors nn.Module
        return self._grads
