"""The fused C++ selective scan (attnlab.layers.ssm_cpp) against the sequential reference.

The first test builds the kernel (about a minute and a half from a cold cache, then torch's
extensions directory keeps it). Inputs are random, from the per-test seed of conftest.py.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.layers import ssm_cpp
from attnlab.layers.ssm import MambaBlock, selective_scan_chunked, selective_scan_sequential

F64 = torch.float64


def scan_inputs(batch, T, D, N, dtype=F64, h0=True) -> list[torch.Tensor | None]:
    x = torch.randn(batch, T, D, dtype=dtype)
    delta = torch.nn.functional.softplus(torch.randn(batch, T, D, dtype=dtype))  # > 0
    A = -torch.rand(D, N, dtype=dtype) * 4 - 0.1  # < 0
    B = torch.randn(batch, T, N, dtype=dtype)
    C = torch.randn(batch, T, N, dtype=dtype)
    h = torch.randn(batch, D, N, dtype=dtype) if h0 else None
    return [t if t is None else t.requires_grad_() for t in (x, delta, A, B, C, h)]


def outputs_and_grads(scan, args, gy, gh):
    """y, h_T and the gradients of Σ y·gy + Σ h_T·gh for every input that is not None."""
    y, h = scan(*args)
    leaves = [t for t in args if t is not None]
    grads = torch.autograd.grad((y * gy).sum() + (h * gh).sum(), leaves)
    return [y, h, *grads]


NAMES = ["y", "h_T", "x", "delta", "A", "B", "C", "h0"]


def test_the_kernel_builds_here():
    """This machine has g++: the compiled scan must be available (not the silent fallback)."""
    assert ssm_cpp.available(), ssm_cpp._STATE.get("error")


@pytest.mark.parametrize(
    "shape",
    [(1, 1, 5, 1), (2, 63, 13, 16), (3, 64, 70, 16), (2, 130, 21, 1), (1, 130, 67, 16)],
)
@pytest.mark.parametrize("with_h0", [True, False])
def test_float64_equals_the_sequential_scan_with_every_gradient(shape, with_h0):
    """(batch, T, D, N): T = 1, 63, 64 (one segment), 130 (three, the last short); D not a
    multiple of 8 and D = 70, 67 over two tiles of 64 channels; N = 1 and 16."""
    args = scan_inputs(*shape, h0=with_h0)
    b, T, D, N = shape
    gy, gh = torch.randn(b, T, D, dtype=F64), torch.randn(b, D, N, dtype=F64)
    want = outputs_and_grads(selective_scan_sequential, args, gy, gh)
    got = outputs_and_grads(ssm_cpp.selective_scan_compiled, args, gy, gh)
    assert len(got) == len(want) == (8 if with_h0 else 7)
    for name, g, w in zip(NAMES, got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=name)


def test_threads_split_rows_without_races():
    """Rows run in parallel: two threads give exactly the one-thread result."""
    args = scan_inputs(5, 70, 67, 16, dtype=torch.float32)
    gy, gh = torch.randn(5, 70, 67), torch.randn(5, 67, 16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = outputs_and_grads(ssm_cpp.selective_scan_compiled, args, gy, gh)
        torch.set_num_threads(2)
        two = outputs_and_grads(ssm_cpp.selective_scan_compiled, args, gy, gh)
    finally:
        torch.set_num_threads(threads)
    for name, a, b in zip(NAMES, one, two):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_float32_equals_float64_to_float32_tolerance():
    args64 = scan_inputs(2, 130, 40, 16)
    args32 = [t.detach().float().requires_grad_() for t in args64]
    gy, gh = torch.randn(2, 130, 40, dtype=F64), torch.randn(2, 40, 16, dtype=F64)
    want = outputs_and_grads(ssm_cpp.selective_scan_compiled, args64, gy, gh)
    got = outputs_and_grads(ssm_cpp.selective_scan_compiled, args32, gy.float(), gh.float())
    for name, g, w in zip(NAMES, got, want):
        assert g.dtype == torch.float32, name
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-4, msg=name)


def test_chunked_and_compiled_agree_in_float32():
    args = scan_inputs(3, 100, 24, 16, dtype=torch.float32)
    gy, gh = torch.randn(3, 100, 24), torch.randn(3, 24, 16)
    want = outputs_and_grads(selective_scan_chunked, args, gy, gh)
    got = outputs_and_grads(ssm_cpp.selective_scan_compiled, args, gy, gh)
    for name, g, w in zip(NAMES, got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4, msg=name)


def block_grads(block, x):
    x = x.clone().requires_grad_()
    y = block(x)
    (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum().backward()
    return [y, x.grad, *(p.grad for p in block.parameters())]


def test_the_mamba_block_runs_compiled_and_equals_the_eager_scan(monkeypatch):
    block = MambaBlock(16, d_state=16, d_conv=4, expand=2).double()
    with torch.no_grad():
        for p in block.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, 70, 16, dtype=F64)
    monkeypatch.delenv(ssm_cpp.EAGER_ENV, raising=False)
    before = ssm_cpp.CALLS[0]
    compiled = block_grads(block, x)
    assert ssm_cpp.CALLS[0] == before + 1, "the block did not use the compiled scan"
    block.zero_grad()
    monkeypatch.setenv(ssm_cpp.EAGER_ENV, "1")
    eager = block_grads(block, x)
    assert ssm_cpp.CALLS[0] == before + 1, "ATTNLAB_EAGER_SCAN=1 still ran the compiled scan"
    for i, (c, e) in enumerate(zip(compiled, eager)):
        torch.testing.assert_close(c, e, rtol=1e-10, atol=1e-10, msg=f"output/grad {i}")


def test_bf16_autocast_block_reaches_the_compiled_scan_upcast():
    """Under bf16 autocast the block runs its scan in float32, so the kernel serves it too."""
    block = MambaBlock(16, d_state=8)
    before = ssm_cpp.CALLS[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = block(torch.randn(2, 9, 16))
    y.float().sum().backward()
    assert ssm_cpp.CALLS[0] == before + 1
    assert torch.isfinite(y.float()).all()


def fake_build(monkeypatch, tmp_path) -> list[bool]:
    """Build into a temp extensions folder with a stand-in for load_inline that records
    whether torch's lock was there when torch would have waited on it forever."""
    import torch.utils.cpp_extension as cpp

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(ssm_cpp, "_STATE", {})
    seen: list[bool] = []

    def load_inline(name, **_):
        seen.append((tmp_path / name / ssm_cpp.TORCH_LOCK).exists())
        return "module"

    monkeypatch.setattr(cpp, "load_inline", load_inline)
    return seen


def test_a_killed_builders_lock_is_removed_not_waited_on(monkeypatch, tmp_path, capsys):
    seen = fake_build(monkeypatch, tmp_path)
    name = "attnlab_scan_v1_" + ("avx2" if "-mavx2" in ssm_cpp._flags() else "base")
    (tmp_path / name).mkdir()
    (tmp_path / name / ssm_cpp.TORCH_LOCK).touch()  # what a kill -9 mid-build leaves
    assert ssm_cpp._build() == "module"
    assert seen == [False]
    err = capsys.readouterr().err.strip().splitlines()
    assert any("removed a stale build lock" in line for line in err), err


def test_a_live_builder_is_waited_for_and_its_lock_kept(monkeypatch, tmp_path, capsys):
    """Another process holds the builder flock: its lock is not stale, so it stays put."""
    import fcntl
    import threading

    seen = fake_build(monkeypatch, tmp_path)
    folder = tmp_path / "build"
    folder.mkdir()
    (folder / ssm_cpp.TORCH_LOCK).touch()
    with open(folder / ssm_cpp.BUILDER, "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        entered = threading.Event()

        def wait() -> None:
            with ssm_cpp.builder_lock(folder):
                entered.set()

        waiter = threading.Thread(target=wait)
        waiter.start()
        assert not entered.wait(0.5), "entered while another builder held the lock"
        assert (folder / ssm_cpp.TORCH_LOCK).exists()
        (folder / ssm_cpp.TORCH_LOCK).unlink()  # the other builder finishes
        fcntl.flock(other, fcntl.LOCK_UN)
    waiter.join(5)
    assert entered.is_set() and seen == []
    assert "waiting for another attnlab process" in capsys.readouterr().err
