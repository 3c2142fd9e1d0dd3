"""L2-SP (attnlab.finetune.l2sp): the coupled penalty against autograd and a hand sum, the
decoupled pull against torch.optim.AdamW's own decoupled weight decay."""

from __future__ import annotations

import copy
import random

import torch
from torch import nn

from attnlab.finetune.l2sp import anchors, attach_l2sp, l2sp_penalty, pull_toward_


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def test_penalty_value_and_gradient():
    net = _net()
    w0 = anchors(net)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p))
    alpha = random.uniform(0.01, 2.0)
    penalty = l2sp_penalty(net, w0, alpha)
    by_hand = sum(((p - w0[n]) ** 2).sum().item() for n, p in net.named_parameters())
    assert abs(penalty.item() - alpha / 2 * by_hand) <= 1e-12 * max(1.0, by_hand)
    penalty.backward()
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.grad, alpha * (p.detach() - w0[name]), rtol=0, atol=1e-14)


def test_penalty_only_over_named_parameters_and_zero_at_the_anchor():
    net = _net()
    w0 = anchors(net, names=["0.weight"])
    assert list(w0) == ["0.weight"]
    assert l2sp_penalty(net, w0, 1.0).item() == 0.0
    with torch.no_grad():
        net[2].weight.add_(1.0)  # not anchored: no penalty
    assert l2sp_penalty(net, w0, 1.0).item() == 0.0


def test_anchors_are_copies():
    net = _net()
    w0 = anchors(net)
    with torch.no_grad():
        net[0].weight.add_(1.0)
    assert not torch.equal(w0["0.weight"], net[0].weight)


def _run(net, optimizer, steps: int, seed: int) -> None:
    """The same gradient sequence for every optimizer: a fixed regression problem."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 5, generator=g).double(), torch.randn(16, 3, generator=g).double()
    for _ in range(steps):
        optimizer.zero_grad()
        ((net(x) - y) ** 2).mean().backward()
        optimizer.step()


def test_decoupled_pull_toward_zero_is_adamw_weight_decay():
    torch.manual_seed(random.randint(0, 10**6))
    alpha, lr, seed = random.uniform(0.01, 0.5), random.uniform(1e-3, 1e-1), random.randint(0, 99)
    ours, ref = _net(), _net()
    ref.load_state_dict(ours.state_dict())
    zero = {name: torch.zeros_like(p) for name, p in ours.named_parameters()}
    opt = torch.optim.AdamW(ours.parameters(), lr=lr, weight_decay=0.0)
    attach_l2sp(opt, ours, zero, alpha)
    _run(ours, opt, 5, seed)
    _run(ref, torch.optim.AdamW(ref.parameters(), lr=lr, weight_decay=alpha), 5, seed)
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)


def test_decoupled_pull_toward_an_anchor_is_adamw_decay_of_the_offset():
    """Gradients do not change under a shift of the weights, so AdamW with decay α on
    v = w - w⁰ must track our pull on w: w_t - w⁰ = v_t. The reference net holds v and computes
    its loss at v + w⁰."""
    torch.manual_seed(random.randint(0, 10**6))
    alpha, lr, seed = random.uniform(0.01, 0.5), random.uniform(1e-3, 1e-1), random.randint(0, 99)
    ours = _net()
    w0 = anchors(ours)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.3 * torch.randn_like(p))  # start away from the anchor
    offset = _net()
    with torch.no_grad():
        for (name, v), w in zip(offset.named_parameters(), ours.parameters()):
            v.copy_(w - w0[name])

    class Shifted(nn.Module):
        def forward(self, x):
            params = {n: v + w0[n] for n, v in offset.named_parameters()}
            return torch.func.functional_call(offset, params, (x,))

    opt = torch.optim.AdamW(ours.parameters(), lr=lr, weight_decay=0.0)
    handle = attach_l2sp(opt, ours, w0, alpha)
    _run(ours, opt, 6, seed)
    ref_opt = torch.optim.AdamW(offset.parameters(), lr=lr, weight_decay=alpha)
    _run(Shifted(), ref_opt, 6, seed)
    for (name, w), v in zip(ours.named_parameters(), offset.parameters()):
        torch.testing.assert_close(w - w0[name], v, rtol=0, atol=1e-12)
    handle.remove()  # the hook can be taken off: the next step is plain AdamW
    before = [p.detach().clone() for p in ours.parameters()]
    plain = torch.optim.AdamW([b.clone().requires_grad_() for b in before], lr=lr, weight_decay=0)
    plain.load_state_dict(copy.deepcopy(opt.state_dict()))
    for p, q in zip(ours.parameters(), plain.param_groups[0]["params"]):
        p.grad = torch.zeros_like(p)
        q.grad = torch.zeros_like(q)
    opt.step()
    plain.step()
    for a, b in zip(ours.parameters(), plain.param_groups[0]["params"]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)


def test_pull_uses_each_groups_lr():
    net = _net()
    w0 = {n: torch.zeros_like(p) for n, p in net.named_parameters()}
    first, second = list(net[0].parameters()), list(net[2].parameters())
    opt = torch.optim.SGD([{"params": first, "lr": 0.1}, {"params": second, "lr": 0.01}], lr=1)
    attach_l2sp(opt, net, w0, alpha=2.0)
    before = [p.detach().clone() for p in net.parameters()]
    for p in net.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    factors = [1 - 0.1 * 2.0] * len(first) + [1 - 0.01 * 2.0] * len(second)
    for p, b, f in zip(net.parameters(), before, factors):
        torch.testing.assert_close(p.detach(), b * f, rtol=0, atol=1e-15)


def test_pull_toward_by_hand():
    w = torch.randn(7, dtype=torch.float64)
    w0 = torch.randn(7, dtype=torch.float64)
    expected = w - 0.05 * 0.3 * (w - w0)
    pull_toward_([w], [w0], lr=0.05, alpha=0.3)
    torch.testing.assert_close(w, expected, rtol=0, atol=1e-15)
