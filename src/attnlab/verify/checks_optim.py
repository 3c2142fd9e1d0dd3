"""Optimizers: attnlab's hand-written Muon and MuonAdamW against ``torch.optim.Muon`` and
``torch.optim.AdamW``: the same random gradients for several steps on random tall, wide and
square matrices (and vectors and 3-D tensors for AdamW), random hyper-parameters; parameters
and momentum buffers compared after every step (float32; the Newton-Schulz iteration in
bfloat16 on both sides, as torch runs it)."""

from __future__ import annotations

import torch

from attnlab.verify.check import Measure
from attnlab.verify.checks_torch import choice, randint

STEPS = 5


def _shapes() -> list[tuple[int, int]]:
    n = randint(4, 24)
    return [(randint(n + 1, 3 * n), n), (n, randint(n + 1, 3 * n)), (n, n)]


def _twins(shapes: list[tuple[int, ...]]) -> tuple[list, list]:
    base = [torch.randn(s) for s in shapes]
    return [torch.nn.Parameter(b.clone()) for b in base], [
        torch.nn.Parameter(b.clone()) for b in base
    ]


def _same_grads(pairs: list[tuple[list, list]]) -> None:
    for ours, theirs in pairs:
        for p, q in zip(ours, theirs):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()


def _muon_kwargs() -> dict:
    return {
        "lr": choice([1e-3, 0.02, 0.05]),
        "weight_decay": choice([0.0, 0.01, 0.1]),
        "momentum": choice([0.8, 0.95]),
        "nesterov": choice([True, False]),
        "ns_steps": randint(1, 5),
        "adjust_lr_fn": choice([None, "original", "match_rms_adamw"]),
    }


def check_muon(m: Measure, cases: int = 3) -> None:
    from attnlab.train.muon import Muon

    for _ in range(cases):
        kwargs = _muon_kwargs()
        ours, theirs = _twins(_shapes())
        mine, ref = Muon(ours, **kwargs), torch.optim.Muon(theirs, **kwargs)
        for _ in range(STEPS):
            _same_grads([(ours, theirs)])
            mine.step()
            ref.step()
            for p, q in zip(ours, theirs):
                m.diff(p, q, "parameter")
                m.diff(mine.state[p]["momentum_buffer"], ref.state[q]["momentum_buffer"], "buffer")
        m.case()


def check_muon_adamw(m: Measure, cases: int = 2) -> None:
    from attnlab.train.muon import NS_COEFFICIENTS, MuonAdamW

    for _ in range(cases):
        kwargs = _muon_kwargs()
        lr, betas, wd = choice([1e-3, 3e-3]), (choice([0.8, 0.9]), choice([0.95, 0.99])), 0.1
        m_ours, m_ref = _twins(_shapes())
        a_ours, a_ref = _twins([(randint(1, 30),), (randint(2, 9), randint(2, 9)), (3, 2, 4)])
        mine = MuonAdamW(
            [
                {
                    "params": m_ours,
                    "use_muon": True,
                    "ns_coefficients": NS_COEFFICIENTS,
                    "eps": 1e-7,
                    **kwargs,
                },
                {
                    "params": a_ours,
                    "use_muon": False,
                    "lr": lr,
                    "betas": betas,
                    "eps": 1e-8,
                    "weight_decay": wd,
                },
            ]
        )
        ref_muon = torch.optim.Muon(m_ref, **kwargs)
        ref_adam = torch.optim.AdamW(a_ref, lr=lr, betas=betas, eps=1e-8, weight_decay=wd)
        pairs = [(m_ours, m_ref), (a_ours, a_ref)]
        for _ in range(STEPS):
            _same_grads(pairs)
            for opt in (mine, ref_muon, ref_adam):
                opt.step()
            for ours, theirs in pairs:
                for p, q in zip(ours, theirs):
                    m.diff(p, q, "parameter")
        m.case()
