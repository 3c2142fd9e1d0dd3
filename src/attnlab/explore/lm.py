"""Page data of a GPT: generate from a prompt, then the causal attention of the whole sequence.

Generation runs with the KV cache as ``attnlab generate`` does; then one forward pass over the
prompt and the generated tokens (no cache) gives every layer's causal attention and, at each
position, the next-token distribution: row ``p - 1`` is what the model saw when it chose the
token at position ``p``.
"""

from __future__ import annotations

from typing import Any

import torch

from attnlab.errors import UserError
from attnlab.explore.pack import build_group, calls_named
from attnlab.explore.sources import Source
from attnlab.infer.generation import Generation, check_sampling, sample_next
from attnlab.infer.lm import encode_prompt
from attnlab.layers.attention_record import record_attention

TOP_K = 10
# Logits kept per step for the page's temperature slider: the whole vocabulary when it is this
# small (character models), else the CANDIDATES most likely tokens (the slider then renormalises
# over them and says so).
FULL_VOCAB = 512
CANDIDATES = 200


def mixer_group(model: torch.nn.Module) -> tuple[str, str]:
    """Name and note of the group that shows the Mamba or RWKV layers' implicit attention."""
    if set(model.cfg.layer_mixers()) - {"attention"} == {"rwkv"}:
        return "RWKV time-mix (its weights)", (
            "RWKV's wkv is a weighted average over the past: each row is that average's weights "
            "(the mean over the channels of each group, shown as heads)"
        )
    return "Mamba hidden attention", (
        "the selective scan written as y_t = Σ_s α_ts x_s (Ali et al. 2024): |α| averaged over "
        "the channels of each group (shown as heads), each row scaled to sum to 1; signs are not "
        "shown"
    )


@torch.no_grad()
def gpt_examples(
    source: Source,
    prompts: list[str],
    max_new_tokens: int = 20,
    temperature: float = 0.0,
    seed: int = 0,
) -> dict[str, Any]:
    """One example per prompt: the generated tokens, their steps and the attention."""
    model, tokenizer = source.run.model.eval(), source.run.tokenizer
    context = model.cfg.context
    check_sampling(temperature, 0, 1.0)
    if not 1 <= max_new_tokens < context:
        raise UserError(f"--max-new-tokens must be in 1..{context - 1}, got {max_new_tokens}")
    examples = []
    for prompt in prompts:
        ids, dropped = encode_prompt(tokenizer, prompt, context - max_new_tokens)
        gen = Generation(model, torch.tensor([ids]), use_cache=True)
        rng = torch.Generator().manual_seed(seed)
        for _ in range(max_new_tokens):
            gen.append(sample_next(gen.next_logits(), temperature, 0, 1.0, rng))
        seq = gen.ids  # (1, T): prompt + generated, T <= context
        with record_attention(model) as rec:
            logits = model(seq)  # (1, T, V)
        probs = torch.softmax(logits[0].float(), dim=-1)  # (T, V)
        n_cand = min(logits.shape[-1], FULL_VOCAB if logits.shape[-1] <= FULL_VOCAB else CANDIDATES)
        all_ids = seq[0].tolist()
        tokens = [tokenizer.decode([i]) for i in all_ids]
        steps = []
        for pos in range(len(ids), len(all_ids)):
            top = probs[pos - 1].topk(TOP_K)
            cand = logits[0, pos - 1].float().topk(n_cand)  # the slider's logits
            steps.append(
                {
                    "position": pos,
                    "token": tokens[pos],
                    "prob": float(probs[pos - 1, all_ids[pos]]),
                    "top": [
                        {"token": tokenizer.decode([int(i)]), "prob": float(p)}
                        for p, i in zip(top.values, top.indices)
                    ],
                    "candidates": [tokenizer.decode([int(i)]) for i in cand.indices],
                    "logits": [round(float(v), 5) for v in cand.values],
                }
            )
        mixer, note = mixer_group(model)
        groups = [
            build_group(name, calls, 0, tokens, tokens, note=about)
            for name, calls, about in (
                ("causal self-attention", calls_named(rec.calls, "self_attn"), ""),
                (mixer, calls_named(rec.calls, "mixer"), note),
            )
            if calls
        ]
        examples.append(
            {
                "input": prompt,
                "groups": groups,
                "generation": {
                    "prompt_tokens": len(ids),
                    "dropped": dropped,
                    "text": tokenizer.decode(all_ids[len(ids) :]),
                    "temperature": temperature,
                    "whole_vocab": n_cand == logits.shape[-1],
                    "steps": steps,
                },
            }
        )
    cfg = model.cfg
    title = (
        f"GPT {source.name} · {cfg.n_layers} layers × {cfg.n_heads} heads · d {cfg.d_model} · "
        f"pos {cfg.pos}" + ("" if cfg.mixer == "attention" else f" · mixer {cfg.mixer}")
    )
    return {"title": title, "examples": examples}
