"""Muon and MuonAdamW against torch.optim.Muon / torch.optim.AdamW, and the Newton-Schulz map
against its SVD form. Shapes are random (tall, wide, square); the seed comes from conftest."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from attnlab.train.checkpoint import load_checkpoint, save_checkpoint
from attnlab.train.muon import NS_COEFFICIENTS, Muon, MuonAdamW, newton_schulz
from attnlab.train.rng import capture_rng

SPEEDRUN = {"lr": 0.02, "weight_decay": 0.0, "momentum": 0.95, "nesterov": True, "ns_steps": 5}


def random_shapes() -> list[tuple[int, int]]:
    """A tall, a wide and a square matrix of random sizes, plus one more of any aspect."""
    n = random.randint(4, 24)
    tall = (random.randint(n + 1, 3 * n), n)
    wide = (n, random.randint(n + 1, 3 * n))
    other = (random.randint(1, 40), random.randint(1, 40))
    return [tall, wide, (n, n), other]


def twin_params(shapes: list[tuple[int, ...]]) -> tuple[list, list]:
    """Two identical lists of fresh leaf parameters."""
    base = [torch.randn(s) for s in shapes]
    return (
        [torch.nn.Parameter(b.clone()) for b in base],
        [torch.nn.Parameter(b.clone()) for b in base],
    )


def run_steps(pairs: list[tuple[list, list]], optimizers: list, steps: int) -> None:
    """Give both parameter lists of each pair the same random gradients, then step all."""
    for _ in range(steps):
        for ours, theirs in pairs:
            for p, q in zip(ours, theirs):
                g = torch.randn_like(p)
                p.grad, q.grad = g.clone(), g.clone()
        for opt in optimizers:
            opt.step()


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # torch.optim.Muon's documented defaults
        SPEEDRUN,  # what the speedrun preset uses
        {"lr": 0.05, "nesterov": False, "weight_decay": 0.01, "adjust_lr_fn": "match_rms_adamw"},
        {"lr": 0.01, "momentum": 0.8, "ns_steps": 3, "ns_coefficients": (3.0, -3.2, 1.2)},
    ],
)
def test_muon_equals_torch_muon(kwargs: dict) -> None:
    ours, theirs = twin_params(random_shapes())
    mine, ref = Muon(ours, **kwargs), torch.optim.Muon(theirs, **kwargs)
    for _ in range(6):
        run_steps([(ours, theirs)], [mine, ref], steps=1)
        for p, q in zip(ours, theirs):
            torch.testing.assert_close(p, q, rtol=1.3e-6, atol=1e-6)
        for p, q in zip(ours, theirs):
            torch.testing.assert_close(
                mine.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"]
            )


def svd_newton_schulz(m: torch.Tensor, steps: int) -> torch.Tensor:
    """The same map through the SVD, in float64: X_0 = M / ||M||_F has singular values
    s / ||M||_F, and every quintic step maps each singular value x to a x + b x^3 + c x^5."""
    u, s, vh = torch.linalg.svd(m.double(), full_matrices=False)
    x = s / s.norm()
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        x = a * x + b * x**3 + c * x**5
    return u @ torch.diag(x) @ vh


@pytest.mark.parametrize("steps", [1, 3, 5])
def test_newton_schulz_float32_is_the_svd_polynomial(steps: int) -> None:
    for shape in random_shapes():
        m = torch.randn(shape)
        got = newton_schulz(m, steps=steps, dtype=torch.float32)
        assert got.dtype == torch.float32 and got.shape == m.shape
        torch.testing.assert_close(got.double(), svd_newton_schulz(m, steps), rtol=0, atol=2e-5)


def test_five_steps_bring_singular_values_near_one() -> None:
    """Jordan et al.: after 5 quintic steps every singular value lies in about [0.7, 1.2]."""
    m = torch.randn(48, 96)
    s = torch.linalg.svdvals(newton_schulz(m, dtype=torch.float32).double())
    assert s.min() > 0.6 and s.max() < 1.25, s


def test_float32_muon_step_follows_the_formula() -> None:
    """ns_dtype=float32 (the speedrun's): B = mu B + (1 - mu) G, M = (1 - mu) G + mu B,
    W <- W - lr sqrt(max(1, R/C)) NS(M), with NS through the SVD."""
    shapes = random_shapes()
    params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    expect = [p.detach().double().clone() for p in params]
    bufs = [torch.zeros(s, dtype=torch.float64) for s in shapes]
    opt = Muon(params, **SPEEDRUN, ns_dtype="float32")
    mu, lr = SPEEDRUN["momentum"], SPEEDRUN["lr"]
    for _ in range(4):
        for i, p in enumerate(params):
            g = torch.randn_like(p)
            p.grad = g
            bufs[i] = mu * bufs[i] + (1 - mu) * g.double()
            m = (1 - mu) * g.double() + mu * bufs[i]
            scale = math.sqrt(max(1.0, p.shape[0] / p.shape[1]))
            expect[i] = expect[i] - lr * scale * svd_newton_schulz(m, 5)
        opt.step()
        for p, e in zip(params, expect):
            torch.testing.assert_close(p.double(), e, rtol=0, atol=1e-5)


def adamw_shapes() -> list[tuple[int, ...]]:
    return [(random.randint(1, 30),), (random.randint(2, 9), random.randint(2, 9)), (3, 2, 4)]


def test_muon_adamw_equals_torch_muon_plus_torch_adamw() -> None:
    """Muon groups step like torch.optim.Muon, AdamW groups like torch.optim.AdamW."""
    m_ours, m_ref = twin_params(random_shapes())
    d_ours, d_ref = twin_params(adamw_shapes())
    n_ours, n_ref = twin_params(adamw_shapes())
    adam = {"use_muon": False, "lr": 3e-3, "betas": (0.8, 0.95), "eps": 1e-8}
    muon = {"use_muon": True, **SPEEDRUN, "ns_coefficients": NS_COEFFICIENTS, "eps": 1e-7}
    mine = MuonAdamW(
        [
            {"params": m_ours, **muon, "adjust_lr_fn": None, "ns_dtype": "bfloat16"},
            {"params": d_ours, **adam, "weight_decay": 0.1},
            {"params": n_ours, **adam, "weight_decay": 0.0},
        ]
    )
    ref_muon = torch.optim.Muon(m_ref, **SPEEDRUN)
    ref_adam = torch.optim.AdamW(
        [{"params": d_ref, "weight_decay": 0.1}, {"params": n_ref, "weight_decay": 0.0}],
        lr=3e-3,
        betas=(0.8, 0.95),
        eps=1e-8,
    )
    pairs = [(m_ours, m_ref), (d_ours, d_ref), (n_ours, n_ref)]
    run_steps(pairs, [mine, ref_muon, ref_adam], steps=7)
    for ours, theirs in pairs:
        for p, q in zip(ours, theirs):
            torch.testing.assert_close(p, q, rtol=1.3e-6, atol=1e-6)


def make_muon_adamw(muon_params: list, adam_params: list) -> MuonAdamW:
    return MuonAdamW(
        [
            {
                "params": muon_params,
                "use_muon": True,
                **SPEEDRUN,
                "ns_coefficients": NS_COEFFICIENTS,
                "eps": 1e-7,
                "adjust_lr_fn": "original",
                "ns_dtype": "float32",
            },
            {
                "params": adam_params,
                "use_muon": False,
                "lr": 1e-2,
                "betas": (0.9, 0.99),
                "eps": 1e-8,
                "weight_decay": 0.1,
            },
        ]
    )


class Pair(torch.nn.Module):
    def __init__(self, m: list[torch.Tensor], a: list[torch.Tensor]) -> None:
        super().__init__()
        self.m = torch.nn.ParameterList([torch.nn.Parameter(t.clone()) for t in m])
        self.a = torch.nn.ParameterList([torch.nn.Parameter(t.clone()) for t in a])


def test_checkpoint_round_trip_continues_bitwise(tmp_path: Path) -> None:
    """3 steps, save_checkpoint, load into a fresh model+optimizer, 3 more steps == 6 steps."""
    m0 = [torch.randn(s) for s in random_shapes()]
    a0 = [torch.randn(s) for s in adamw_shapes()]
    grads = [[torch.randn_like(t) for t in m0 + a0] for _ in range(6)]

    def step(model: Pair, opt: MuonAdamW, k: int) -> None:
        for p, g in zip(list(model.m) + list(model.a), grads[k]):
            p.grad = g.clone()
        opt.step()

    ref = Pair(m0, a0)
    ref_opt = make_muon_adamw(list(ref.m), list(ref.a))
    for k in range(6):
        step(ref, ref_opt, k)
    first = Pair(m0, a0)
    first_opt = make_muon_adamw(list(first.m), list(first.a))
    for k in range(3):
        step(first, first_opt, k)
    save_checkpoint(tmp_path, first, first_opt, {"step": 3}, [capture_rng()])
    second = Pair([torch.zeros_like(t) for t in m0], [torch.zeros_like(t) for t in a0])
    second_opt = make_muon_adamw(list(second.m), list(second.a))
    load_checkpoint(tmp_path, second, second_opt)
    for k in range(3, 6):
        step(second, second_opt, k)
    for p, q in zip(second.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    assert second_opt.param_groups[0]["ns_dtype"] == "float32"


def test_bad_input_is_a_one_line_value_error() -> None:
    with pytest.raises(ValueError, match="2-D matrices only"):
        Muon([torch.nn.Parameter(torch.randn(3))])
    with pytest.raises(ValueError, match="adjust_lr_fn"):
        Muon([torch.nn.Parameter(torch.randn(3, 3))], adjust_lr_fn="other")
    with pytest.raises(ValueError, match="ns_dtype"):
        Muon([torch.nn.Parameter(torch.randn(3, 3))], ns_dtype="float16")
    with pytest.raises(ValueError, match="AdamW group lacks lr, weight_decay, betas, eps"):
        MuonAdamW([{"params": [torch.nn.Parameter(torch.randn(3))], "use_muon": False}])
    with pytest.raises(ValueError, match="use_muon"):
        MuonAdamW([{"params": [torch.nn.Parameter(torch.randn(3))]}])
