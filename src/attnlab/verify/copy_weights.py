"""Copy weights from a reference module into attnlab's, and compare gradients the same way.

Each ``*_links`` function pairs every parameter of an attnlab module with the reference
tensors it is made of (one ``Link`` per parameter): ``copy_links`` loads the reference values,
``assert_grads_match`` checks that each attnlab gradient equals the same combination of the
reference gradients. One function per reference module type; the stacks reuse the layer ones.
Every function checks that its links cover all of attnlab's parameters exactly once, so a
parameter that is forgotten fails loudly instead of keeping its random initial value.
Used by the tests and by ``attnlab verify`` (one definition of each mapping).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnlab.layers.attention import MultiHeadAttention
from attnlab.layers.blocks import Block, BlockStack, DecoderBlock, FeedForward
from attnlab.layers.moe import MoEFeedForward
from attnlab.layers.positions import T5RelativePositionBias
from attnlab.layers.rwkv import ChannelMix, TimeMix
from attnlab.layers.ssm import MambaBlock
from attnlab.models.vit import ViT


def _same(t: Tensor) -> Tensor:
    return t


@dataclass
class Link:
    """attnlab parameter ``ours`` == ``join(*theirs)``."""

    ours: nn.Parameter
    theirs: tuple[Tensor, ...]
    join: Callable[..., Tensor] = field(default=_same)
    name: str = ""


def _cat(*ts: Tensor) -> Tensor:
    return torch.cat(ts, dim=0)


def _covers(module: nn.Module, links: Sequence[Link]) -> list[Link]:
    ours = [id(link.ours) for link in links]
    expected = {id(p): n for n, p in module.named_parameters()}
    missing = [n for i, n in expected.items() if i not in ours]
    if missing:
        raise ValueError(f"parameters with no reference: {missing}")
    if not len(ours) == len(set(ours)) == len(expected):
        raise ValueError("a parameter is linked twice")
    return list(links)


def copy_links(links: Sequence[Link]) -> None:
    with torch.no_grad():
        for link in links:
            value = link.join(*link.theirs)
            if value.shape != link.ours.shape:
                raise ValueError(
                    f"{link.name}: reference shape {tuple(value.shape)}, "
                    f"attnlab's {tuple(link.ours.shape)}"
                )
            link.ours.copy_(value)


def assert_grads_match(links: Sequence[Link], rtol: float = 1e-7, atol: float = 1e-9) -> None:
    for link in links:
        assert link.ours.grad is not None, f"no gradient for {link.name}"
        expected = link.join(*(t.grad for t in link.theirs))
        torch.testing.assert_close(link.ours.grad, expected, rtol=rtol, atol=atol, msg=link.name)


def max_grad_error(links: Sequence[Link]) -> float:
    """Largest |attnlab gradient − reference gradient| over all linked parameters."""
    worst = 0.0
    for link in links:
        if link.ours.grad is None:
            raise ValueError(f"no gradient for {link.name}")
        expected = link.join(*(t.grad for t in link.theirs))
        worst = max(worst, (link.ours.grad - expected).abs().max().item())
    return worst


# --------------------------------------------------------------------------- torch.nn


def linear_links(ours: nn.Linear, weight: Tensor, bias: Tensor | None, name: str) -> list[Link]:
    links = [Link(ours.weight, (weight,), name=f"{name}.weight")]
    if ours.bias is not None or bias is not None:
        assert ours.bias is not None and bias is not None, f"{name}: bias on one side only"
        links.append(Link(ours.bias, (bias,), name=f"{name}.bias"))
    return links


def layer_norm_links(ours: nn.Module, theirs: nn.Module, name: str = "norm") -> list[Link]:
    """nn.LayerNorm / nn.RMSNorm / HF RMSNorm -> attnlab's norm (weight and optional bias)."""
    links = [Link(ours.weight, (theirs.weight,), name=f"{name}.weight")]
    if getattr(ours, "bias", None) is not None:
        links.append(Link(ours.bias, (theirs.bias,), name=f"{name}.bias"))
    return links


def _rows(start: int, stop: int | None = None) -> Callable[[Tensor], Tensor]:
    return lambda t: t[start:stop]


def mha_links(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> list[Link]:
    """nn.MultiheadAttention -> MultiHeadAttention: ``q_proj`` = the query rows of the input
    projection, ``kv_proj`` = its key and value rows (packed ``in_proj_weight`` when kdim ==
    vdim == embed_dim, else ``q_proj_weight`` / ``k_proj_weight`` / ``v_proj_weight``; the
    bias ``in_proj_bias`` is packed either way)."""
    d = ours.q_proj.out_features
    if theirs.in_proj_weight is not None:
        links = [
            Link(ours.q_proj.weight, (theirs.in_proj_weight,), _rows(0, d), "q_proj.weight"),
            Link(ours.kv_proj.weight, (theirs.in_proj_weight,), _rows(d), "kv_proj.weight"),
        ]
    else:
        links = [
            Link(ours.q_proj.weight, (theirs.q_proj_weight,), name="q_proj.weight"),
            Link(
                ours.kv_proj.weight,
                (theirs.k_proj_weight, theirs.v_proj_weight),
                _cat,
                "kv_proj.weight",
            ),
        ]
    b = theirs.in_proj_bias
    if b is not None or ours.q_proj.bias is not None:
        assert b is not None and ours.q_proj.bias is not None, "in_proj bias on one side only"
        links.append(Link(ours.q_proj.bias, (b,), _rows(0, d), "q_proj.bias"))
        links.append(Link(ours.kv_proj.bias, (b,), _rows(d), "kv_proj.bias"))
    links += linear_links(ours.out_proj, theirs.out_proj.weight, theirs.out_proj.bias, "out")
    return _covers(ours, links)


def _ff_links(ours: FeedForward, theirs: nn.Module) -> list[Link]:
    return linear_links(
        ours.w_in, theirs.linear1.weight, theirs.linear1.bias, "linear1"
    ) + linear_links(ours.w_out, theirs.linear2.weight, theirs.linear2.bias, "linear2")


def encoder_layer_links(ours: Block, theirs: nn.TransformerEncoderLayer) -> list[Link]:
    links = mha_links(ours.self_attn, theirs.self_attn) + _ff_links(ours.ff, theirs)
    links += layer_norm_links(ours.norm1, theirs.norm1, "norm1")
    links += layer_norm_links(ours.norm2, theirs.norm2, "norm2")
    return _covers(ours, links)


def decoder_layer_links(ours: DecoderBlock, theirs: nn.TransformerDecoderLayer) -> list[Link]:
    links = mha_links(ours.self_attn, theirs.self_attn)
    links += mha_links(ours.cross_attn, theirs.multihead_attn)
    links += _ff_links(ours.ff, theirs)
    for i in (1, 2, 3):
        links += layer_norm_links(getattr(ours, f"norm{i}"), getattr(theirs, f"norm{i}"), f"n{i}")
    return _covers(ours, links)


def transformer_links(ours: nn.Module, theirs: nn.Transformer) -> list[Link]:
    """nn.Transformer -> a module with ``encoder`` (BlockStack) and ``decoder`` (Decoder)."""
    links: list[Link] = []
    for mine, ref in zip(ours.encoder.blocks, theirs.encoder.layers, strict=True):
        links += encoder_layer_links(mine, ref)
    for mine, ref in zip(ours.decoder.blocks, theirs.decoder.layers, strict=True):
        links += decoder_layer_links(mine, ref)
    links += layer_norm_links(ours.encoder.norm, theirs.encoder.norm, "encoder.norm")
    links += layer_norm_links(ours.decoder.norm, theirs.decoder.norm, "decoder.norm")
    return _covers(ours, links)


# --------------------------------------------------------------------------- Hugging Face


def llama_mlp_links(ours: FeedForward, theirs: nn.Module) -> list[Link]:
    """LlamaMLP -> FeedForward("swiglu"): ``w_in`` = [gate_proj; up_proj], ``w_out`` = down."""
    links = [
        Link(ours.w_in.weight, (theirs.gate_proj.weight, theirs.up_proj.weight), _cat, "w_in"),
        Link(ours.w_out.weight, (theirs.down_proj.weight,), name="w_out"),
    ]
    return _covers(ours, links)


def llama_layer_links(ours: Block, theirs: nn.Module) -> list[Link]:
    """LlamaDecoderLayer (or Qwen3's, with QK-norm) -> Block(norm="rms", activation="swiglu",
    bias=False)."""
    a = theirs.self_attn
    links = [
        Link(ours.self_attn.q_proj.weight, (a.q_proj.weight,), name="q_proj"),
        Link(ours.self_attn.kv_proj.weight, (a.k_proj.weight, a.v_proj.weight), _cat, "kv_proj"),
        Link(ours.self_attn.out_proj.weight, (a.o_proj.weight,), name="o_proj"),
    ]
    if ours.self_attn.q_norm is not None:  # Qwen3's QK-norm
        links += layer_norm_links(ours.self_attn.q_norm, a.q_norm, "q_norm")
        links += layer_norm_links(ours.self_attn.k_norm, a.k_norm, "k_norm")
    links += llama_mlp_links(ours.ff, theirs.mlp)
    links += layer_norm_links(ours.norm1, theirs.input_layernorm, "input_layernorm")
    links += layer_norm_links(ours.norm2, theirs.post_attention_layernorm, "post_attn_norm")
    return _covers(ours, links)


def llama_gpt_links(ours: nn.Module, theirs: nn.Module) -> list[Link]:
    """LlamaForCausalLM / Qwen3ForCausalLM -> attnlab GPT (rope, rms, swiglu, no biases,
    untied head): embeddings, every layer, the final norm and the head."""
    links = [
        Link(ours.tok_emb.weight, (theirs.model.embed_tokens.weight,), name="embed_tokens"),
        Link(ours.head.weight, (theirs.lm_head.weight,), name="lm_head"),
    ]
    for mine, ref in zip(ours.stack.blocks, theirs.model.layers, strict=True):
        links += llama_layer_links(mine, ref)
    links += layer_norm_links(ours.stack.norm, theirs.model.norm, "final_norm")
    return _covers(ours, links)


def llama_model_links(embedding: nn.Embedding, stack: BlockStack, theirs: nn.Module) -> list[Link]:
    """LlamaModel -> (nn.Embedding, BlockStack of LLaMA-style blocks with a final RMSNorm)."""
    links = [Link(embedding.weight, (theirs.embed_tokens.weight,), name="embed_tokens")]
    for mine, ref in zip(stack.blocks, theirs.layers, strict=True):
        links += llama_layer_links(mine, ref)
    links += layer_norm_links(stack.norm, theirs.norm, "final_norm")
    _covers(stack, links[1:])
    return links


def mamba_mixer_links(ours: MambaBlock, theirs: nn.Module) -> list[Link]:
    """MambaMixer -> MambaBlock: the same parameters under the same names (conv1d's weight is
    (D_inner, 1, d_conv) in both)."""
    mine, ref = dict(ours.named_parameters()), dict(theirs.named_parameters())
    if sorted(mine) != sorted(ref):
        raise ValueError(f"Mamba parameters differ: {sorted(mine)} vs {sorted(ref)}")
    return _covers(ours, [Link(p, (ref[n],), name=n) for n, p in mine.items()])


def mamba_lm_links(ours: nn.Module, theirs: nn.Module) -> list[Link]:
    """MambaForCausalLM -> the GPT with mixer "mamba", ffn "none", RMSNorm, tied head:
    embeddings, per layer norm + mixer, the final norm."""
    backbone = theirs.backbone
    links = [Link(ours.tok_emb.weight, (backbone.embeddings.weight,), name="embeddings")]
    for i, (mine, ref) in enumerate(zip(ours.stack.blocks, backbone.layers, strict=True)):
        links += layer_norm_links(mine.norm1, ref.norm, f"layers.{i}.norm")
        links += mamba_mixer_links(mine.mixer, ref.mixer)
    links += layer_norm_links(ours.stack.norm, backbone.norm_f, "norm_f")
    return _covers(ours, links)


def _same_names(ours: nn.Module, theirs: nn.Module, prefix: str) -> list[Link]:
    """One link per parameter of ``ours``, to the parameter of ``theirs`` of the same name."""
    ref = dict(theirs.named_parameters())
    mine = dict(ours.named_parameters())
    if sorted(mine) != sorted(ref):
        raise ValueError(f"{prefix}: parameters differ: {sorted(mine)} vs {sorted(ref)}")
    return [Link(p, (ref[n],), name=f"{prefix}.{n}") for n, p in mine.items()]


def rwkv_layer_links(ours: TimeMix | ChannelMix, theirs: nn.Module, prefix: str) -> list[Link]:
    """RwkvSelfAttention -> TimeMix, RwkvFeedForward -> ChannelMix: same names and shapes."""
    return _covers(ours, _same_names(ours, theirs, prefix))


def rwkv_lm_links(ours: nn.Module, theirs: nn.Module) -> list[Link]:
    """RwkvForCausalLM -> the GPT with mixer "rwkv" (LayerNorm, untied head): embeddings,
    layer 0's pre_ln, per layer ln1 + time-mix + ln2 + channel-mix, ln_out, head."""
    model = theirs.rwkv
    links = [Link(ours.tok_emb.weight, (model.embeddings.weight,), name="embeddings")]
    for i, (mine, ref) in enumerate(zip(ours.stack.blocks, model.blocks, strict=True)):
        if i == 0:
            links += layer_norm_links(mine.pre_norm, ref.pre_ln, "blocks.0.pre_ln")
        links += layer_norm_links(mine.norm1, ref.ln1, f"blocks.{i}.ln1")
        links += rwkv_layer_links(mine.mixer, ref.attention, f"blocks.{i}.attention")
        links += layer_norm_links(mine.norm2, ref.ln2, f"blocks.{i}.ln2")
        links += rwkv_layer_links(mine.ff, ref.feed_forward, f"blocks.{i}.feed_forward")
    links += layer_norm_links(ours.stack.norm, model.ln_out, "ln_out")
    links.append(Link(ours.head.weight, (theirs.head.weight,), name="head"))
    return _covers(ours, links)


def mixtral_moe_links(ours: MoEFeedForward, theirs: nn.Module) -> list[Link]:
    """MixtralSparseMoeBlock -> MoEFeedForward("swiglu"): router = gate.weight (E, D);
    w_in = experts.gate_up_proj (E, 2F, D), gate rows first; w_out = experts.down_proj."""
    links = [
        Link(ours.router.weight, (theirs.gate.weight,), name="gate"),
        Link(ours.w_in, (theirs.experts.gate_up_proj,), name="gate_up_proj"),
        Link(ours.w_out, (theirs.experts.down_proj,), name="down_proj"),
    ]
    return _covers(ours, links)


@torch.no_grad()
def copy_t5_attention(ours: MultiHeadAttention, bias: T5RelativePositionBias, theirs: nn.Module):
    """T5Attention -> MultiHeadAttention(bias=False) + T5RelativePositionBias. T5 does not scale
    scores by 1/sqrt(d_kv), so the query weights absorb sqrt(d_kv)."""
    dk = theirs.key_value_proj_dim
    q = theirs.q.weight * math.sqrt(dk)
    ours.q_proj.weight.copy_(q)
    ours.kv_proj.weight.copy_(torch.cat([theirs.k.weight, theirs.v.weight]))
    ours.out_proj.weight.copy_(theirs.o.weight)
    bias.embedding.weight.copy_(theirs.relative_attention_bias.weight)


_VIT_V4_NAMES = [  # transformers 4 spelled the same tensors differently
    ("encoder.layer.", "layers."),
    ("attention.attention.query", "attention.q_proj"),
    ("attention.attention.key", "attention.k_proj"),
    ("attention.attention.value", "attention.v_proj"),
    ("attention.output.dense", "attention.o_proj"),
    ("intermediate.dense", "mlp.fc1"),
    ("output.dense", "mlp.fc2"),
]


def copy_vit(model: ViT, hf: nn.Module) -> None:
    """ViTForImageClassification (transformers 4 or 5 names) -> attnlab's ViT, every tensor."""
    src = {}
    for k, v in hf.state_dict().items():
        for old, new in _VIT_V4_NAMES:
            k = k.replace(old, new)
        src[k.removeprefix("vit.")] = v
    sd = {
        "cls_token": src["embeddings.cls_token"],
        "pos_embed.embedding.weight": src["embeddings.position_embeddings"][0],
        "patch_embed.proj.weight": src["embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": src["embeddings.patch_embeddings.projection.bias"],
        "encoder.norm.weight": src["layernorm.weight"],
        "encoder.norm.bias": src["layernorm.bias"],
        "head.weight": src["classifier.weight"],
        "head.bias": src["classifier.bias"],
    }
    names = {
        "self_attn.out_proj": "attention.o_proj",
        "ff.w_in": "mlp.fc1",
        "ff.w_out": "mlp.fc2",
        "norm1": "layernorm_before",
        "norm2": "layernorm_after",
    }
    for i in range(model.cfg.n_layers):
        ours, theirs = f"encoder.blocks.{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            sd[ours + f"self_attn.q_proj.{kind}"] = src[theirs + f"attention.q_proj.{kind}"]
            sd[ours + f"self_attn.kv_proj.{kind}"] = torch.cat(
                [src[theirs + f"attention.{x}_proj.{kind}"] for x in "kv"]
            )
            for a, b in names.items():
                sd[ours + f"{a}.{kind}"] = src[theirs + f"{b}.{kind}"]
    model.load_state_dict(sd, strict=True)
