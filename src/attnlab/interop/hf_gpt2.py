"""Hugging Face GPT-2 checkpoints (config.json + model.safetensors) <-> attnlab's GPT.

GPT-2 stores its linear layers as ``Conv1D`` with weights (in, out); attnlab's ``nn.Linear``
holds (out, in), so every matrix is transposed on the way. GPT-2's ``c_attn`` packs queries,
keys and values in that order: attnlab's ``q_proj`` rows, then ``kv_proj``'s (the map below
names the packed ``qkv``, which ``MultiHeadAttention`` reads on load). Only the architecture
GPT-2 has can be exported: learned positions, LayerNorm with biases, GELU, tied embeddings and
no grouped-query attention.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from attnlab.errors import UserError
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.tensor_files import read_tensors, save_safetensors

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_UNSUPPORTED = {  # GPT-2 options attnlab's GPT does not implement, with their neutral value
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
}


def config_from_hf(hf: dict) -> GPTConfig:
    """GPTConfig of a GPT-2 ``config.json``; options attnlab cannot honour raise ValueError."""
    if hf.get("model_type") != "gpt2":
        raise UserError(
            f"expected a GPT-2 config (model_type 'gpt2'), got {hf.get('model_type')!r}"
        )
    for key, neutral in _UNSUPPORTED.items():
        if hf.get(key, neutral) != neutral:
            raise UserError(f"GPT-2 option {key}={hf[key]!r} is not supported by attnlab's GPT")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in _ACTIVATIONS:
        raise UserError(
            f"activation_function {activation!r} is not supported; use one of {list(_ACTIVATIONS)}"
        )
    d = hf["n_embd"]
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        context=hf["n_positions"],
        n_layers=hf["n_layer"],
        n_heads=hf["n_head"],
        d_model=d,
        d_ff=hf.get("n_inner") or 4 * d,
        pos="learned",
        norm="layer",
        activation=_ACTIVATIONS[activation],
        bias=True,
        tie_weights=hf.get("tie_word_embeddings", True),
        dropout=0.0,
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
    )


def config_to_hf(cfg: GPTConfig) -> dict:
    """The GPT-2 ``config.json`` of a GPT-2-shaped GPTConfig (ValueError if it is not one)."""
    problems = []
    if cfg.pos != "learned":
        problems.append("pos='learned'")
    if cfg.norm != "layer" or not cfg.bias:
        problems.append("norm='layer' with bias=true")
    if cfg.activation not in ("gelu", "gelu_tanh"):
        problems.append("activation='gelu' or 'gelu_tanh'")
    if cfg.kv_heads != cfg.n_heads:
        problems.append("n_kv_heads=0 (no grouped-query attention)")
    if cfg.attention != "full":
        problems.append("attention='full'")
    for name in ("qk_norm", "value_embeddings"):
        if getattr(cfg, name):
            problems.append(f"{name}=false")
    if cfg.logit_softcap:
        problems.append("logit_softcap=0")
    if cfg.mixer != "attention" or cfg.ffn != "dense":
        problems.append("mixer='attention' with ffn='dense'")
    if problems:
        raise UserError("GPT-2 export needs " + ", ".join(problems))
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.context,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layers,
        "n_head": cfg.n_heads,
        "n_inner": cfg.ff_width,
        "activation_function": "gelu_new" if cfg.activation == "gelu_tanh" else "gelu",
        "layer_norm_epsilon": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_weights,
        "resid_pdrop": cfg.dropout,
        "embd_pdrop": cfg.dropout,
        "attn_pdrop": cfg.dropout,
        "bos_token_id": cfg.vocab_size - 1,
        "eos_token_id": cfg.vocab_size - 1,
    }


def _key_map(cfg: GPTConfig) -> dict[str, tuple[str, bool]]:
    """attnlab parameter name -> (GPT-2 name, transposed?)."""
    names = {
        "tok_emb.weight": ("transformer.wte.weight", False),
        "pos_emb.embedding.weight": ("transformer.wpe.weight", False),
        "stack.norm.weight": ("transformer.ln_f.weight", False),
        "stack.norm.bias": ("transformer.ln_f.bias", False),
    }
    parts = {
        "norm1": ("ln_1", False),
        "self_attn.qkv": ("attn.c_attn", True),
        "self_attn.out_proj": ("attn.c_proj", True),
        "norm2": ("ln_2", False),
        "ff.w_in": ("mlp.c_fc", True),
        "ff.w_out": ("mlp.c_proj", True),
    }
    for i in range(cfg.n_layers):
        for ours, (theirs, conv) in parts.items():
            names[f"stack.blocks.{i}.{ours}.weight"] = (f"transformer.h.{i}.{theirs}.weight", conv)
            names[f"stack.blocks.{i}.{ours}.bias"] = (f"transformer.h.{i}.{theirs}.bias", False)
    if not cfg.tie_weights:
        names["head.weight"] = ("lm_head.weight", False)
    return names


def load_hf_gpt2(directory: str | Path) -> GPT:
    """attnlab GPT holding the weights of a Hugging Face GPT-2 directory (eval mode)."""
    directory = Path(directory)
    config_path, weights_path = directory / "config.json", directory / "model.safetensors"
    for path in (config_path, weights_path):
        if not path.exists():
            raise UserError(f"{directory} is not a GPT-2 checkpoint directory: no {path.name}")
    try:
        hf_config = json.loads(config_path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{config_path}: not a valid JSON file ({err}); restore it") from None
    cfg = config_from_hf(hf_config)
    state = read_tensors(weights_path, "GPT-2 weights")
    if not any(k.startswith("transformer.") for k in state):  # saved from GPT2Model
        state = {f"transformer.{k}": v for k, v in state.items()}
    model = GPT(cfg)
    ours: dict[str, Tensor] = {}
    for name, (theirs, conv) in _key_map(cfg).items():
        if theirs not in state:
            raise UserError(f"{weights_path} lacks {theirs}; is it a GPT-2 checkpoint?")
        ours[name] = state[theirs].t() if conv else state[theirs]
    if cfg.tie_weights:
        ours["head.weight"] = ours["tok_emb.weight"]
    for packed in [n for n in ours if ".self_attn.qkv." in n]:  # GPT-2's c_attn: q, k, v rows
        q, kv = ours.pop(packed).split((cfg.d_model, 2 * cfg.d_model))
        ours[packed.replace("qkv", "q_proj")], ours[packed.replace("qkv", "kv_proj")] = q, kv
    model.load_state_dict(ours, strict=True)
    return model.eval()


def save_hf_gpt2(model: GPT, directory: str | Path) -> Path:
    """Write ``model`` as a Hugging Face GPT-2 directory that ``GPT2LMHeadModel`` loads."""
    directory = Path(directory)
    hf_config = config_to_hf(model.cfg)
    params = dict(model.named_parameters(remove_duplicate=False))
    for q_name in [n for n in params if ".self_attn.q_proj." in n]:  # GPT-2 packs q, k, v
        kv = params.pop(q_name.replace("q_proj", "kv_proj"))
        params[q_name.replace("q_proj", "qkv")] = torch.cat([params.pop(q_name), kv])
    state = {
        theirs: (params[ours].t() if conv else params[ours]).detach().contiguous().cpu()
        for ours, (theirs, conv) in _key_map(model.cfg).items()
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    save_safetensors(state, directory / "model.safetensors", metadata={"format": "pt"})
    return directory
