"""Parity of the linear-time mixers against Hugging Face: the GPT with ``mixer = "mamba"`` vs
``MambaForCausalLM`` and with ``mixer = "rwkv"`` vs ``RwkvForCausalLM``, weights copied.

Both references compute their recurrence in float32 on the CPU whatever the input (HF's Mamba
loop and RWKV's ``key.float()``), so attnlab runs in float32 too and the tolerances are set for
float32. Each model is the one a user trains (``attnlab train lm --mixer mamba --ffn none
--norm rms`` or ``--mixer rwkv``), not a copy written for the check.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnlab.models.gpt import GPT, GPTConfig
from attnlab.verify.check import Measure
from attnlab.verify.checks_hf import _transformers, backward_both
from attnlab.verify.checks_torch import choice, randint
from attnlab.verify.copy_weights import (
    Link,
    copy_links,
    mamba_lm_links,
    max_grad_error,
    rwkv_lm_links,
)

CONTEXT = 256  # longer than any sequence the checks feed
# Two logits this close are a float32 tie: a greedy step may pick either (HF's rounding differs
# from ours by up to ~1e-6; RWKV's top two logits are within 1e-4 in ~1% of continuations).
TIE = 1e-5


@torch.no_grad()
def greedy(model: GPT, ids: Tensor, steps: int) -> Tensor:
    """Greedy continuation through the GPT's decoding caches: ids (B, T) -> (B, T + steps)."""
    caches = model.new_caches()
    logits = model(ids, caches)[:, -1]  # (B, V)
    out = [ids]
    for i in range(steps):
        nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
        out.append(nxt)
        if i + 1 < steps:
            logits = model(nxt, caches)[:, -1]  # (B, V)
    return torch.cat(out, dim=1)


def _hf_greedy(hf: nn.Module, prompt: Tensor, steps: int) -> Tensor:
    hf.generation_config.eos_token_id = None  # no early stop: every step is compared
    return hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=steps,
        do_sample=False,
        pad_token_id=0,
    )


@torch.no_grad()
def _greedy_ties(model: GPT, got: Tensor, want: Tensor, start: int) -> bool:
    """Whether two greedy continuations (B, T) agree up to a float32 tie: at the first step
    where a row parts, our full forward on the common prefix gives the two tokens logits
    within ``TIE`` (after that the rows follow different prefixes and are not compared)."""
    if got.shape != want.shape:
        return False
    for row in range(got.shape[0]):
        apart = (got[row, start:] != want[row, start:]).nonzero()
        if len(apart) == 0:
            continue
        t = start + int(apart[0])
        logits = model(got[row : row + 1, :t])[0, -1]  # (V,)
        if (logits[got[row, t]] - logits[want[row, t]]).abs() > TIE:
            return False
    return True


def _cached_equals_full(m: Measure, model: GPT, ids: Tensor) -> None:
    """Prefill a random prefix, then one token at a time: the logits of one full forward."""
    with torch.no_grad():
        caches = model.new_caches()
        split = randint(1, ids.shape[1])
        pieces = [model(ids[:, :split], caches)]
        pieces += [model(ids[:, t : t + 1], caches) for t in range(split, ids.shape[1])]
        m.diff(torch.cat(pieces, dim=1), model(ids), "cached decode")


def _compare_lm(m: Measure, hf: nn.Module, ours: GPT, rowwise: bool = False) -> None:
    """Logits, greedy continuations token for token, the cached decode. With ``rowwise`` HF
    sees each row alone, for its forward and its generate (transformers 5.24's RWKV returns
    (B, B, V) logits for a batch of B > 1 one-token rows, and its stateful batched decode
    departs from its own full forward)."""
    hf.eval()
    ours.eval()
    ids = torch.randint(0, hf.config.vocab_size, (randint(1, 3), randint(1, 80)))
    with torch.no_grad():
        pieces = ids.split(1) if rowwise else [ids]
        want_logits = torch.cat([hf(input_ids=piece).logits for piece in pieces])
        m.diff(ours(ids), want_logits, "logits")
        prompt, steps = ids[:, : randint(1, 6)], randint(4, 16)
        rows = prompt.split(1) if rowwise else [prompt]
        want = torch.cat([_hf_greedy(hf, row, steps) for row in rows])
        got = greedy(ours, prompt, steps)
        if not _greedy_ties(ours, got, want, prompt.shape[1]):
            m.fail("greedy continuation differs from HF generate")
    _cached_equals_full(m, ours, ids)


# --------------------------------------------------------------------------- Mamba


def mamba_pair(tf, scan: str = "chunked") -> tuple[nn.Module, GPT, list[Link]]:
    """A tiny random MambaForCausalLM (weights off its structured init, so that a transposed
    A or D would show) and the GPT with mixer "mamba" holding the same weights."""
    d = 8 * randint(2, 5)
    config = tf.MambaConfig(
        vocab_size=randint(20, 70),
        hidden_size=d,
        state_size=randint(2, 12),
        num_hidden_layers=randint(1, 2),
        expand=randint(1, 2),
        conv_kernel=randint(2, 4),
        time_step_rank=choice(["auto", randint(1, 6)]),
        layer_norm_epsilon=1e-5,
        use_mambapy=False,
        use_associative_scan=False,  # HF's sequential loop, the CPU path
    )
    hf = tf.MambaForCausalLM(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    rank = config.time_step_rank
    ours = GPT(
        GPTConfig(
            vocab_size=config.vocab_size,
            context=CONTEXT,
            n_layers=config.num_hidden_layers,
            n_heads=1,
            d_model=d,
            pos="rope",  # acts on attention layers only: none here
            norm="rms",
            bias=False,
            norm_eps=config.layer_norm_epsilon,
            tie_weights=True,
            mixer="mamba",
            ffn="none",
            d_state=config.state_size,
            d_conv=config.conv_kernel,
            expand=config.expand,
            dt_rank=0 if rank == "auto" else rank,
        )
    )
    for block in ours.stack.blocks:
        block.mixer.scan = scan
    links = mamba_lm_links(ours, hf)
    copy_links(links)
    return hf, ours, links


def check_mamba_logits(m: Measure, cases: int = 4) -> None:
    """MambaForCausalLM (PyTorch path) == GPT(mixer="mamba", ffn="none"), float32: logits
    (chunked and sequential scans), greedy continuations token for token, the cached decode."""
    tf = _transformers()
    for i in range(cases):
        hf, ours, _ = mamba_pair(tf, "chunked" if i % 2 == 0 else "sequential")
        _compare_lm(m, hf, ours)
        m.case()


def check_mamba_grads(m: Measure, cases: int = 2) -> None:
    """Every parameter gradient of the Mamba GPT == MambaForCausalLM's, float32."""
    tf = _transformers()
    for _ in range(cases):
        hf, ours, links = mamba_pair(tf, "chunked")
        ids = torch.randint(0, hf.config.vocab_size, (randint(1, 2), randint(2, 40)))
        backward_both(ours(ids), hf(input_ids=ids).logits)
        m.value(max_grad_error(links))
        m.case()


# --------------------------------------------------------------------------- RWKV


def rwkv_pair(tf) -> tuple[nn.Module, GPT, list[Link]]:
    """A tiny random RwkvForCausalLM (its init scrambled: decays, bonuses and mixes off their
    structured values) and the GPT with mixer "rwkv" holding the same weights."""
    d = 4 * randint(2, 8)
    config = tf.RwkvConfig(
        vocab_size=randint(20, 70),
        context_length=CONTEXT,
        hidden_size=d,
        num_hidden_layers=randint(2, 3),  # HF's init divides by layers - 1
        intermediate_size=randint(8, 48),
        layer_norm_epsilon=1e-5,
        rescale_every=0,  # HF halves activations every k layers at inference otherwise
        tie_word_embeddings=False,
    )
    hf = tf.RwkvForCausalLM(config)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("time_decay"):
                p.copy_(torch.randn_like(p) - 0.5)  # w = e^decay from ~0.1 to ~5
            elif "time_mix" in name:
                p.uniform_(0.0, 1.0)
            elif p.dim() >= 2:
                p.normal_(0.0, 0.5 * p.shape[-1] ** -0.5 if "embeddings" not in name else 1.0)
            else:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
    ours = GPT(
        GPTConfig(
            vocab_size=config.vocab_size,
            context=CONTEXT,
            n_layers=config.num_hidden_layers,
            n_heads=1,
            d_model=d,
            d_ff=config.intermediate_size,
            pos="rope",  # acts on attention layers only: none here
            norm="layer",
            bias=True,  # LayerNorm biases (RWKV's projections have none)
            norm_eps=config.layer_norm_epsilon,
            tie_weights=False,
            mixer="rwkv",
            ffn="dense",
        )
    )
    links = rwkv_lm_links(ours, hf)
    copy_links(links)
    return hf, ours, links


def check_rwkv_logits(m: Measure, cases: int = 4) -> None:
    """RwkvForCausalLM (its CPU path) == GPT(mixer="rwkv"), float32: logits with the chunked
    and the recurrent wkv, greedy continuations token for token, the cached decode. HF's
    generate runs one row at a time: with transformers 5.24 its stateful decode of a batch of
    several rows departs from its own full forward (seen here, not in attnlab's model)."""
    tf = _transformers()
    for i in range(cases):
        hf, ours, _ = rwkv_pair(tf)
        for block in ours.stack.blocks:
            block.mixer.form = "chunked" if i % 2 == 0 else "sequential"
            block.mixer.chunk = randint(1, 16)
        _compare_lm(m, hf, ours, rowwise=True)
        m.case()


def check_rwkv_grads(m: Measure, cases: int = 2) -> None:
    """Every parameter gradient of the RWKV GPT (chunked wkv) == RwkvForCausalLM's, float32."""
    tf = _transformers()
    for _ in range(cases):
        hf, ours, links = rwkv_pair(tf)
        hf.train()
        ids = torch.randint(0, hf.config.vocab_size, (randint(1, 2), randint(2, 40)))
        backward_both(ours(ids), hf(input_ids=ids).logits)
        m.value(max_grad_error(links))
        m.case()
