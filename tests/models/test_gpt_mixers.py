"""GPT with Mamba / hybrid mixers and mixture-of-experts feed-forwards.

* every mixer (attention, mamba, hybrid) x feed-forward (dense, moe): KV-cache / SSM-state
  decoding == full recompute at every step, across window slides and row drops;
* hybrid layout: layers attn_every, 2·attn_every, ... are attention, the others Mamba;
* ``aux_loss()`` == moe_aux_weight · Hugging Face ``load_balancing_loss_func`` (Mixtral) on
  each layer's router logits + moe_z_weight · mean(logsumexp²), averaged over the MoE layers,
  and its gradient reaches the routers; ``expert_usage()`` == a hand count of the top-k
  choices; both are 0 / [] for a dense model;
* the LM step adds the auxiliary loss and logs the usage, also through a DDP-style wrapper;
* checkpoints of every combination save and load; a dense attention GPT keeps its weight names;
* bad settings are refused with the field to change; every bundled LM preset takes
  --mixer mamba / hybrid and --ffn moe.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from attnlab.infer.generation import Generation, sample_next
from attnlab.layers.moe import MoEFeedForward
from attnlab.layers.ssm import MambaBlock
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.runs.sections import PRESETS
from attnlab.tasks.lm import lm_step
from attnlab.train import load_weights, save_weights

F64 = torch.float64
MIXERS = ("attention", "mamba", "hybrid", "rwkv")
FFNS = ("dense", "moe", "none")
V = 41


def tiny(mixer: str = "attention", ffn: str = "dense", **changes) -> GPTConfig:
    base = dict(
        vocab_size=V, context=16, n_layers=4, n_heads=2, d_model=16, d_ff=24, mixer=mixer,
        ffn=ffn, attn_every=2, d_state=4, experts=4, top_k=2, activation="swiglu",
    )  # fmt: skip
    if mixer in ("mamba", "rwkv"):
        base["n_layers"] = 2
    return GPTConfig(**{**base, **changes})


def scramble(model: nn.Module) -> nn.Module:
    """Weights away from init, but Mamba's A_log and Δ bias kept (they must stay stable)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_proj.bias", "time_decay")):
                continue
            p.normal_(0.0, 0.3) if p.dim() >= 2 else p.normal_(1.0, 0.2)
    return model


@pytest.mark.parametrize("ffn", FFNS)
@pytest.mark.parametrize("mixer", MIXERS)
def test_cached_decoding_equals_full_recompute(mixer: str, ffn: str) -> None:
    """30 steps with a context of 16: the window slides; logits agree at every step; then
    a row is dropped and the survivors still agree with a fresh uncached decode."""
    model = scramble(GPT(tiny(mixer, ffn))).to(F64).eval()
    prompt = torch.randint(0, V, (3, 5))
    cached, uncached = Generation(model, prompt, True), Generation(model, prompt, False)
    for step in range(30):
        a, b = cached.next_logits(), uncached.next_logits()
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=f"step {step}")
        tokens = sample_next(a, temperature=0)
        cached.append(tokens)
        uncached.append(tokens)
    assert cached.start > 0  # the window slid: caches were rebuilt
    kinds = {type(c).__name__ for c in cached.caches}
    assert kinds == {"attention": {"KVCache"}, "mamba": {"MambaCache"}, "rwkv": {"RwkvCache"}}.get(
        mixer, {"KVCache", "MambaCache"}
    )
    rows = torch.tensor([2, 0])
    cached.keep(rows)
    alone = Generation(model, cached.ids, use_cache=False)
    alone.start = cached.start
    torch.testing.assert_close(cached.next_logits(), alone.next_logits(), rtol=1e-9, atol=1e-9)


def test_hybrid_layout_interleaves_mamba_and_attention() -> None:
    model = GPT(tiny("hybrid", n_layers=6, attn_every=3))
    kinds = ["A" if b.mixer is None else "M" for b in model.stack.blocks]
    assert "".join(kinds) == "MMAMMA"
    assert all(isinstance(b.mixer, MambaBlock) for b in model.stack.blocks if b.mixer is not None)
    assert GPT(tiny("hybrid")).cfg.layer_mixers() == ["mamba", "attention"] * 2
    assert all(b.self_attn is None for b in GPT(tiny("mamba")).stack.blocks)


# --------------------------------------------------------------------------- MoE losses


def test_aux_loss_matches_hugging_face_mixtral_balance_loss_and_z_loss() -> None:
    mixtral = pytest.importorskip("transformers.models.mixtral.modeling_mixtral")
    cfg = tiny("hybrid", "moe", moe_aux_weight=0.03, moe_z_weight=0.002)
    model = scramble(GPT(cfg))
    ids = torch.randint(0, V, (3, 11))
    model(ids)
    per_layer = []
    for _, ff in model.moe_layers():
        logits = ff.stats.router_logits  # (N, E)
        balance = mixtral.load_balancing_loss_func((logits,), cfg.experts, cfg.top_k)
        z = torch.logsumexp(logits, dim=-1).square().mean()
        per_layer.append(0.03 * balance + 0.002 * z)
    assert len(per_layer) == 4
    torch.testing.assert_close(model.aux_loss(), torch.stack(per_layer).mean())
    model.aux_loss().backward()
    for _, ff in model.moe_layers():
        assert ff.router.weight.grad.abs().sum() > 0


def test_expert_usage_counts_the_top_k_choices() -> None:
    model = scramble(GPT(tiny("attention", "moe", n_layers=2)))
    model(torch.randint(0, V, (2, 9)))
    usage = model.expert_usage()
    assert [u["layer"] for u in usage] == [0, 1]
    for (_, ff), u in zip(model.moe_layers(), usage, strict=True):
        chosen = ff.stats.router_logits.topk(2, dim=-1).indices  # (N, k)
        counts = torch.bincount(chosen.reshape(-1), minlength=4).double()
        assert u["usage"] == pytest.approx((counts / counts.sum()).tolist())
        assert u["dropped"] == 0.0


def test_capacity_drops_are_reported() -> None:
    model = scramble(GPT(tiny("attention", "moe", n_layers=2, capacity_factor=0.5)))
    model(torch.randint(0, V, (2, 12)))
    assert all(u["dropped"] > 0 for u in model.expert_usage())


def test_dense_model_has_no_aux_loss_or_usage() -> None:
    for mixer in MIXERS:
        model = GPT(tiny(mixer))
        model(torch.randint(0, V, (1, 4)))
        assert model.aux_loss().item() == 0.0 and model.expert_usage() == []


def test_lm_step_adds_aux_loss_and_logs_usage() -> None:
    model = scramble(GPT(tiny("hybrid", "moe")))
    batch = {"input_ids": torch.randint(0, V, (2, 10)), "targets": torch.randint(0, V, (2, 10))}
    out = lm_step(model, batch)
    ce = torch.nn.functional.cross_entropy(
        model(batch["input_ids"]).reshape(-1, V), batch["targets"].reshape(-1)
    )
    torch.testing.assert_close(out.loss, ce + model.aux_loss())
    assert out.metrics["lm_loss"] == pytest.approx(ce.item())
    assert out.metrics["aux_loss"] == pytest.approx(model.aux_loss().item())
    shares = [out.metrics[f"moe1_e{j}"] for j in range(4)]
    assert sum(shares) == pytest.approx(1.0) and "moe3_dropped" in out.metrics
    wrapped = nn.Module()
    wrapped.module = model  # what DistributedDataParallel exposes
    wrapped.forward = model.forward
    assert lm_step(wrapped, batch).metrics.keys() == out.metrics.keys()
    dense = lm_step(GPT(tiny()), batch)
    assert dense.metrics == {}


# --------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("ffn", FFNS)
@pytest.mark.parametrize("mixer", MIXERS)
def test_checkpoints_save_and_load(tmp_path, mixer: str, ffn: str) -> None:
    cfg = tiny(mixer, ffn)
    model = scramble(GPT(cfg)).eval()
    save_weights(model, tmp_path / "m.safetensors")
    other = GPT(cfg).eval()
    load_weights(other, tmp_path / "m.safetensors")
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids), other(ids))


def test_dense_attention_gpt_keeps_its_weight_names() -> None:
    names = set(GPT(tiny(n_layers=1)).state_dict())
    assert names == {
        "tok_emb.weight", "pos_emb.embedding.weight", "head.weight", "stack.norm.weight",
        "stack.norm.bias", "stack.blocks.0.self_attn.q_proj.weight",
        "stack.blocks.0.self_attn.q_proj.bias", "stack.blocks.0.self_attn.kv_proj.weight",
        "stack.blocks.0.self_attn.kv_proj.bias", "stack.blocks.0.self_attn.out_proj.weight",
        "stack.blocks.0.self_attn.out_proj.bias", "stack.blocks.0.ff.w_in.weight",
        "stack.blocks.0.ff.w_in.bias", "stack.blocks.0.ff.w_out.weight",
        "stack.blocks.0.ff.w_out.bias", "stack.blocks.0.norm1.weight",
        "stack.blocks.0.norm1.bias", "stack.blocks.0.norm2.weight", "stack.blocks.0.norm2.bias",
    }  # fmt: skip


# --------------------------------------------------------------------------- init, size, config


def test_init_keeps_mamba_ssm_parameters_and_scales_outputs() -> None:
    model = GPT(tiny("hybrid", "moe", d_model=64, n_heads=4, zero_init_proj=False))
    for block in model.stack.blocks:
        if block.mixer is not None:
            A = -torch.exp(block.mixer.A_log)  # S4D-real: -1, -2, ..., -N per channel
            torch.testing.assert_close(A[0], -torch.arange(1.0, 5.0))
            dt = torch.nn.functional.softplus(block.mixer.dt_proj.bias)
            assert dt.min() >= 1e-4 and dt.max() <= 0.1 + 1e-6
    zero = GPT(tiny("hybrid", "moe", zero_init_proj=True))
    for block in zero.stack.blocks:
        out = block.mixer.out_proj if block.mixer is not None else block.self_attn.out_proj
        assert out.weight.abs().sum() == 0 and block.ff.w_out.abs().sum() == 0


def test_active_params_count_top_k_of_the_experts() -> None:
    model = GPT(tiny("attention", "moe"))
    experts = sum(ff.w_in.numel() + ff.w_out.numel() for _, ff in model.moe_layers())
    assert model.num_params() - model.active_params() == experts // 4 * 2  # 2 of 4 unused
    assert isinstance(model.stack.blocks[0].ff, MoEFeedForward)
    dense = GPT(tiny())
    assert dense.active_params() == dense.num_params()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(mixer="hybrid", attn_every=5), "has no attention layer"),
        (dict(ffn="moe", experts=2, top_k=3), "top_k=3 exceeds experts=2"),
        (dict(mixer="ssm"), "GPTConfig.mixer must be one of attention, mamba, hybrid"),
        (dict(ffn="moe", capacity_factor=-1.0), "capacity_factor must be >= 0"),
    ],
)
def test_bad_settings_are_refused(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny(**changes)


@pytest.mark.parametrize("preset", sorted(p.stem for p in PRESETS.glob("lm*.toml")))
def test_every_lm_preset_takes_mamba_hybrid_and_moe(preset: str) -> None:
    """LM_CONFIG.md: --mixer mamba / hybrid and --ffn moe work on any preset; the settings of
    attention (rope, qk_norm, value embeddings) act on the attention layers only."""
    from attnlab.runs.training import build_config

    shrink = dict(vocab_size=V, n_layers=2, d_model=32, n_heads=4, n_kv_heads=0, d_ff=0)
    ids = torch.randint(0, V, (1, 6))
    for changes in (
        dict(mixer="mamba"),
        dict(mixer="hybrid"),
        dict(mixer="rwkv"),
        dict(ffn="moe", experts=4),
        dict(mixer="mamba", ffn="none"),
    ):
        flat = {**{k: str(v) for k, v in changes.items()}}
        model_cfg = build_config("lm", preset, flat).sections["model"]
        cfg = GPTConfig(**{**model_cfg.__dict__, **shrink, "context": 8})
        model = GPT(cfg).eval()
        with torch.no_grad():
            assert model(ids).shape == (1, 6, V)
        if cfg.mixer == "mamba":
            assert model.value_emb is None  # no attention layer would read it


# --------------------------------------------------------------------------- bf16


@pytest.mark.parametrize("ffn", FFNS)
@pytest.mark.parametrize("mixer", MIXERS)
def test_every_mixer_and_ffn_trains_a_step_under_bf16_autocast(mixer: str, ffn: str) -> None:
    """The LM step under CPU bf16 autocast (what --precision bf16 runs): no dtype error in the
    Mamba scan, the RWKV wkv or the expert dispatch, a finite loss, a gradient for every
    parameter; and the logits stay near fp32's (the recurrences run in float32 inside)."""
    torch.manual_seed(0)
    model = GPT(tiny(mixer, ffn))
    ids = torch.randint(0, V, (2, 16))
    batch = {"input_ids": ids[:, :-1], "targets": ids[:, 1:]}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = lm_step(model, batch)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    with torch.no_grad():
        want = model(ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = model(ids).float()
    assert (got - want).abs().max() < 0.05 * want.abs().max() + 0.05


def test_cli_trains_the_mixers_with_precision_bf16(tmp_path) -> None:
    """`attnlab train lm --precision bf16` end to end, Mamba + MoE and RWKV (2 steps each)."""
    from attnlab.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("anna sees bob. bob likes cleo. cleo hears anna.\n" * 200)
    base = ["train", "lm", "--config", "quick", "--data", str(corpus), "--max-steps", "2"]
    base += ["--precision", "bf16", "n_layers=2", "d_model=32", "n_heads=2", "experts=4"]
    for flags in (["--mixer", "mamba", "--ffn", "moe"], ["--mixer", "rwkv"]):
        out = tmp_path / flags[1]
        assert main([*base, *flags, "--out", str(out)]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["precision"] == "bf16"
