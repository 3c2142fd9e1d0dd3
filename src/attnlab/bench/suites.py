"""The benchmarks of ``attnlab bench``; each returns a dict of timings and ratios.

Every comparison copies the same weights into both sides and checks once that they compute
the same numbers before timing them (interleaved rounds, :mod:`attnlab.bench.timing`).
Training steps are forward + backward (+ AdamW for the GPT step), float32 unless stated.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.bench.memory import run_isolated
from attnlab.bench.timing import interleaved, median_ms, paired_ratio
from attnlab.infer.generation import Generation
from attnlab.layers.attention import (
    MultiHeadAttention,
    explicit_attention,
    scaled_dot_product_attention,
)
from attnlab.layers.blocks import Block, BlockConfig
from attnlab.layers.efficient import LinearAttention, LocalAttention
from attnlab.layers.flash import flash_attention
from attnlab.models.gpt import GPT, GPTConfig
from attnlab.train.optim import build_optimizer
from attnlab.train.precision import autocast, choose_precision, precision_name
from attnlab.verify.copy_weights import copy_links, encoder_layer_links, mha_links

VOCAB = 84  # the Shakespeare characters


def _hf():
    """transformers, or None when it is not installed (the Hugging Face rows are skipped)."""
    try:
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    return transformers


def _summary(samples: dict[str, list[float]], baseline: str) -> dict:
    ms = median_ms(samples)
    return {
        "ms": {k: round(v, 2) for k, v in ms.items()},
        f"ratio_to_{baseline}": {k: round(paired_ratio(samples, k, baseline), 3) for k in ms},
        "rounds": len(next(iter(samples.values()))),
    }


def bench_kernels(device, rounds: int, T: int, window: int = 128) -> dict:
    """Attention alone, fwd + bwd, causal, (B, H, T, Dh) = (4, 8, T, 64)."""
    q, k, v = (torch.randn(4, 8, T, 64, device=device, requires_grad=True) for _ in range(3))
    cot = torch.randn(4, 8, T, 64, device=device)
    local, linear = LocalAttention(window), LinearAttention()
    kw = dict(mask=None, is_causal=True, bias=None, dropout_p=0.0, need_weights=False, cache=None)
    runs = {
        "explicit": lambda: explicit_attention(q, k, v, is_causal=True)[0],
        "fused": lambda: scaled_dot_product_attention(q, k, v, is_causal=True)[0],
        f"local_w{window}": lambda: local(q, k, v, **kw)[0],
        "linear": lambda: linear(q, k, v, **kw)[0],
        "flash": lambda: flash_attention(q, k, v, is_causal=True),  # attnlab.layers.flash, by hand
    }
    samples = interleaved(
        {n: (lambda f=f: f().backward(cot)) for n, f in runs.items()}, rounds, device
    )
    return {"shape": [4, 8, T, 64], **_summary(samples, "fused")}


def bench_mha(device, rounds: int, B: int, T: int) -> dict:
    """attnlab MultiHeadAttention vs nn.MultiheadAttention (512, 8 heads), same weights."""
    ours = MultiHeadAttention(512, 8).to(device)
    theirs = nn.MultiheadAttention(512, 8, batch_first=True).to(device)
    copy_links(mha_links(ours, theirs))
    x = torch.randn(B, T, 512, device=device, requires_grad=True)
    cot = torch.randn(B, T, 512, device=device)
    blocked = torch.ones(T, T, dtype=torch.bool, device=device).triu(1)
    rows = {}
    for causal in (False, True):
        m = blocked if causal else None

        def a(c=causal):
            return ours(x, is_causal=c)[0]

        def b(c=causal, m=m):
            return theirs(x, x, x, need_weights=False, attn_mask=m, is_causal=c)[0]

        with torch.no_grad():
            torch.testing.assert_close(a(), b(), rtol=1e-4, atol=1e-5)
        samples = interleaved(
            {"attnlab": lambda: a().backward(cot), "torch": lambda: b().backward(cot)},
            rounds,
            device,
        )
        rows["causal" if causal else "bidirectional"] = _summary(samples, "torch")
    return {"B": B, "T": T, **rows}


def bench_encoder_layer(device, rounds: int, B: int, T: int) -> dict:
    """attnlab Block vs nn.TransformerEncoderLayer (512, 8, 2048, pre-norm, ReLU)."""
    ours = Block(BlockConfig(512, 8, 2048, dropout=0.0, norm_position="pre")).to(device)
    theirs = nn.TransformerEncoderLayer(
        512, 8, 2048, dropout=0.0, batch_first=True, norm_first=True
    ).to(device)
    copy_links(encoder_layer_links(ours, theirs))
    x = torch.randn(B, T, 512, device=device, requires_grad=True)
    cot = torch.randn(B, T, 512, device=device)
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], theirs(x), rtol=1e-4, atol=1e-4)
    samples = interleaved(
        {"attnlab": lambda: ours(x)[0].backward(cot), "torch": lambda: theirs(x).backward(cot)},
        rounds,
        device,
    )
    return {"B": B, "T": T, **_summary(samples, "torch")}


def _gpt(layers, heads, d, context, **kw) -> GPT:
    cfg = GPTConfig(
        vocab_size=VOCAB,
        context=context,
        n_layers=layers,
        n_heads=heads,
        d_model=d,
        activation="gelu_tanh",
        **kw,
    )
    return GPT(cfg)


def hf_gpt2(transformers, layers, heads, d, context) -> nn.Module:
    """A random-init Hugging Face GPT2LMHeadModel of that shape (no dropout, SDPA attention)."""
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=context,
        n_embd=d,
        n_layer=layers,
        n_head=heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    config._attn_implementation = "sdpa"
    return transformers.GPT2LMHeadModel(config)


def bench_gpt_step(device, rounds: int, shape: tuple[int, int, int, int, int]) -> dict:
    """GPT training step (fwd, CE, bwd, AdamW) vs GPT2LMHeadModel; attnlab at `auto`
    precision too; gradient checkpointing's peak memory and time, in fresh processes."""
    layers, heads, d, context, batch = shape
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (batch, context), device=device)
    dtype, reason = choose_precision(device, "auto")

    def step_of(model: nn.Module, logits_of, amp=None):
        opt = build_optimizer(model, 1e-4, 0.1, (0.9, 0.99))

        def step() -> None:
            with autocast(device, amp) if amp is not None else contextlib.nullcontext():
                logits = logits_of(model, ids)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), ids.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    ours = _gpt(layers, heads, d, context).to(device)
    steps = {"attnlab": step_of(ours, lambda m, i: m(i))}
    auto_name = precision_name(dtype)
    if dtype is not None:
        amp_model = _gpt(layers, heads, d, context).to(device)
        steps[f"attnlab_{auto_name}"] = step_of(amp_model, lambda m, i: m(i), dtype)
    transformers = _hf()
    if transformers is not None:
        hf = hf_gpt2(transformers, layers, heads, d, context).to(device)
        steps["hf_gpt2"] = step_of(hf, lambda m, i: m(i).logits)
    samples = interleaved(steps, rounds, device)
    out = {
        "shape": dict(layers=layers, heads=heads, width=d, context=context, batch=batch),
        "auto_precision": auto_name,
        "auto_precision_reason": reason,
        **_summary(samples, "hf_gpt2" if transformers is not None else "attnlab"),
    }
    if transformers is None:
        out["note"] = "transformers is not installed: no Hugging Face reference"
    spec = dict(
        case="gpt",
        vocab=VOCAB,
        n_layers=layers,
        n_heads=heads,
        d_model=d,
        context=context,
        batch=batch,
        threads=torch.get_num_threads(),
        device=str(device),
        repeats=max(2, rounds // 2),
        time_cap_s=30.0,
    )
    out["checkpointing"] = {
        flag: run_isolated({**spec, "checkpointing": flag == "on"}) for flag in ("off", "on")
    }
    return out


def bench_generation(device, rounds: int, new_tokens: int) -> dict:
    """ms per token of greedy decoding, 4 × 128 GPT (context 1024), with and without a cache,
    for full, local (window 64) and linear attention; HF generate with/without its cache."""
    torch.manual_seed(0)
    prompt = torch.randint(0, VOCAB, (1, 10), device=device)
    models = {
        "full": _gpt(4, 4, 128, 1024),
        "local_w64": _gpt(4, 4, 128, 1024, attention="local", window=64),
        "linear": _gpt(4, 4, 128, 1024, attention="linear"),
    }

    def decode(model: GPT, use_cache: bool):
        def run() -> None:
            gen = Generation(model, prompt, use_cache=use_cache)
            for _ in range(new_tokens):
                gen.append(gen.next_logits().argmax(-1))

        return run

    runs = {}
    for name, model in models.items():
        model.to(device).eval()
        runs[f"{name}_cache"] = decode(model, True)
        runs[f"{name}_no_cache"] = decode(model, False)
    transformers = _hf()
    if transformers is not None:
        hf = hf_gpt2(transformers, 4, 4, 128, 1024).to(device).eval()
        for use in (True, False):
            runs[f"hf_{'cache' if use else 'no_cache'}"] = lambda u=use: hf.generate(
                prompt,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                use_cache=u,
                pad_token_id=0,
            )
    with torch.no_grad():
        samples = interleaved(runs, rounds, device)
    per_token = {k: round(v / new_tokens, 3) for k, v in median_ms(samples).items()}
    return {"new_tokens": new_tokens, "ms_per_token": per_token, "rounds": rounds}


def bench_e5_step(device, rounds: int, shape: tuple[int, int]) -> dict:
    """One fine-tuning step of the e5 classifier (fwd, CE, bwd, AdamW) vs transformers'
    XLMRobertaForSequenceClassification of the same shape on the same batch; random weights,
    the word table frozen on both sides (attnlab's is 4-bit packed, HF's a float table)."""
    from attnlab.models.bert import BertClassifier, BertConfig

    batch, length = shape
    cfg = BertConfig(vocab_size=250037, d_model=384, n_layers=12, n_heads=12, d_ff=1536,
                     context=512, pad_id=1, position_offset=2, packed_words=True)  # fmt: skip
    torch.manual_seed(0)
    ids = torch.randint(5, 250000, (batch, length), device=device)
    lengths = torch.full((batch,), length, device=device)
    labels = torch.randint(0, 2, (batch,), device=device)

    def step_of(model: nn.Module, logits_of):
        opt = build_optimizer(model, 2e-5, 0.01, (0.9, 0.999))

        def step() -> None:
            loss = F.cross_entropy(logits_of(model), labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    ours = BertClassifier(cfg, 2).to(device).train()
    ours.bert.pooler.requires_grad_(False)  # mean pooling: the pooler is not on the path
    steps = {"attnlab": step_of(ours, lambda m: m(ids, lengths))}
    transformers = _hf()
    if transformers is not None:
        hf_cfg = transformers.XLMRobertaConfig(
            **cfg.to_hf()
            | {"model_type": "xlm-roberta", "max_position_embeddings": 514, "num_labels": 2}
        )
        hf = transformers.XLMRobertaForSequenceClassification(hf_cfg).to(device).train()
        hf.roberta.embeddings.word_embeddings.requires_grad_(False)
        steps["hf_xlmr"] = step_of(hf, lambda m: m(input_ids=ids).logits)
    samples = interleaved(steps, rounds, device)
    out = {
        "shape": dict(batch=batch, length=length, layers=12, width=384),
        **_summary(samples, "hf_xlmr" if transformers is not None else "attnlab"),
    }
    if transformers is None:
        out["note"] = "transformers is not installed: no Hugging Face reference"
    return out
