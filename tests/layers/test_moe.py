"""Mixture-of-experts feed-forward (attnlab.layers.moe) against Mixtral and against a token-by-token
reference.

* MoEFeedForward == ``transformers``' MixtralSparseMoeBlock with copied weights: outputs, router
  logits, the gradients of the input and of every parameter (float32: HF routes in float32
  whatever the input dtype, so that is the dtype where both compute the same thing);
* the load-balancing loss == HF's ``load_balancing_loss_func`` (value and gradient), with and
  without an attention mask, one layer and several layers;
* capacity: a plain loop over tokens in priority order gives the same output and drop count;
* usage shares, z-loss, error messages.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnlab.layers.moe import MoEFeedForward, load_balancing_loss, router_z_loss
from attnlab.verify.copy_weights import assert_grads_match, copy_links, mixtral_moe_links

transformers = pytest.importorskip("transformers")
from transformers.models.mixtral.modeling_mixtral import (  # noqa: E402
    MixtralSparseMoeBlock,
    load_balancing_loss_func,
)

D, F_, E = 16, 24, 6


def mixtral_pair(top_k: int):
    config = transformers.MixtralConfig(
        hidden_size=D, intermediate_size=F_, num_local_experts=E, num_experts_per_tok=top_k
    )
    config._experts_implementation = "eager"
    hf = MixtralSparseMoeBlock(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    ours = MoEFeedForward(D, F_, experts=E, top_k=top_k, activation="swiglu")
    links = mixtral_moe_links(ours, hf)
    copy_links(links)
    return hf, ours, links


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_moe_matches_mixtral_outputs_router_logits_and_gradients(top_k):
    hf, ours, links = mixtral_pair(top_k)
    x = torch.randn(3, 11, D)
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = hf(x_hf)
    got = ours(x_ours)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    want_logits = hf.gate(x.reshape(-1, D))[0]
    torch.testing.assert_close(ours.stats.router_logits, want_logits, rtol=1e-6, atol=1e-6)
    cot = torch.randn_like(want)
    (want * cot).sum().backward()
    (got * cot).sum().backward()
    torch.testing.assert_close(x_ours.grad, x_hf.grad, rtol=1e-6, atol=1e-6)
    assert_grads_match(links, rtol=1e-6, atol=1e-6)
    assert ours.stats.dropped == 0.0
    torch.testing.assert_close(ours.stats.usage.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("masked", [False, True])
def test_balance_loss_equals_hugging_face(top_k, masked):
    logits = (torch.randn(4 * 9, E) * 2).requires_grad_()
    mask = (torch.rand(4, 9) > 0.3).long() if masked else None
    mask_flat = None if mask is None else mask.reshape(-1)
    want = load_balancing_loss_func((logits,), E, top_k, mask)
    got = load_balancing_loss(logits, top_k, mask_flat)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    (g_want,) = torch.autograd.grad(want, logits)
    (g_got,) = torch.autograd.grad(got, logits)
    torch.testing.assert_close(g_got, g_want, rtol=1e-6, atol=1e-7)
    # several layers: HF pools the layers' tokens, which is the loss on the concatenation
    layers = tuple(torch.randn(4 * 9, E) for _ in range(3))
    many = load_balancing_loss_func(layers, E, top_k, mask)
    pooled = None if mask is None else mask_flat.repeat(3)
    torch.testing.assert_close(
        load_balancing_loss(torch.cat(layers), top_k, pooled), many, rtol=1e-6, atol=1e-6
    )


def test_module_losses_and_usage_follow_the_mask():
    _, ours, _ = mixtral_pair(2)
    ours.aux_weight, ours.z_weight = 0.3, 0.05
    x = torch.randn(2, 7, D)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 4:] = False
    ours(x, mask)
    stats = ours.stats
    real_logits = stats.router_logits[mask.reshape(-1)]
    torch.testing.assert_close(stats.balance_loss, load_balancing_loss(real_logits, 2))
    z = (torch.logsumexp(real_logits, -1) ** 2).mean()
    torch.testing.assert_close(stats.z_loss, z)
    torch.testing.assert_close(ours.aux_loss, 0.3 * stats.balance_loss + 0.05 * z)
    chosen = real_logits.topk(2, dim=-1).indices.reshape(-1)
    want_usage = torch.bincount(chosen, minlength=E).float() / chosen.numel()
    torch.testing.assert_close(stats.usage, want_usage)
    # perfectly balanced top-2 routing (token t -> experts t, t+1 mod E): the loss is k = 2
    balanced = torch.zeros(12, E)
    balanced[torch.arange(12), torch.arange(12) % E] = 3.0
    balanced[torch.arange(12), (torch.arange(12) + 1) % E] = 2.0
    torch.testing.assert_close(load_balancing_loss(balanced, 2), torch.tensor(2.0))
    assert load_balancing_loss(balanced[:1].expand(12, E), 2) > 2.5  # all on two experts: about 5.4
    torch.testing.assert_close(router_z_loss(torch.zeros(5, E)), torch.tensor(math.log(E) ** 2))


def reference_with_capacity(ours: MoEFeedForward, x2: torch.Tensor, cap: int):
    """A loop over top-k slots and tokens: first choices first, each expert takes at most cap."""
    logits = ours.router(x2)
    w, idx = torch.softmax(logits, -1).topk(ours.top_k, -1)
    w = w / w.sum(-1, keepdim=True)
    out = torch.zeros_like(x2)
    load = [0] * ours.experts
    dropped = 0
    for slot in range(ours.top_k):
        for t in range(x2.shape[0]):
            e = int(idx[t, slot])
            if load[e] >= cap:
                dropped += 1
                continue
            load[e] += 1
            out[t] += w[t, slot] * ours.expert(e, x2[t : t + 1])[0]
    return out, dropped


@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 1.25])
def test_capacity_drops_what_a_token_loop_drops(capacity_factor):
    _, ours, _ = mixtral_pair(2)
    ours = ours.double()
    ours.capacity_factor = capacity_factor
    with torch.no_grad():
        ours.router.weight[0] += 1.0  # crowd expert 0 so that something overflows
    x = torch.randn(2, 15, D, dtype=torch.float64)
    got = ours(x)
    cap = ours.capacity(30)
    assert cap == math.ceil(capacity_factor * 30 * 2 / E)
    want, dropped = reference_with_capacity(ours, x.reshape(-1, D), cap)
    torch.testing.assert_close(got.reshape(-1, D), want, rtol=1e-10, atol=1e-12)
    assert ours.stats.dropped == pytest.approx(dropped / 60)
    if capacity_factor < 1:
        assert dropped > 0


def test_gelu_experts_and_active_parameters():
    moe = MoEFeedForward(8, 32, experts=4, top_k=1, activation="gelu").double()
    x = torch.randn(5, 8, dtype=torch.float64)
    y = moe(x[None])[0]
    e = moe.router(x).argmax(-1)
    want = torch.stack(
        [moe.w_out[k] @ torch.nn.functional.gelu(moe.w_in[k] @ x[i]) for i, k in enumerate(e)]
    )
    torch.testing.assert_close(y, want)
    assert moe.num_active_params() == 8 * 4 + (32 * 8 + 8 * 32)


def test_bad_settings_name_the_field():
    for kw, words in (
        (dict(experts=0), "experts"),
        (dict(top_k=9), "top_k"),
        (dict(capacity_factor=-1.0), "capacity_factor"),
        (dict(aux_weight=-0.1), "moe_aux_weight"),
        (dict(z_weight=-0.1), "moe_z_weight"),
        (dict(activation="tanh"), "activation"),
    ):
        with pytest.raises(ValueError, match=words):
            MoEFeedForward(8, 16, **kw)
    with pytest.raises(ValueError, match="after a forward"):
        _ = MoEFeedForward(8, 16).aux_loss
