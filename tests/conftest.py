"""Shared test set-up: a fresh random seed for every test, printed when the test fails.

Every test starts from torch, numpy and ``random`` seeded with a seed drawn anew for that test,
so each run of the suite checks new random inputs. When a test fails, its report carries a
section ``attnlab seed`` with the line to replay it::

    ATTNLAB_SEED=123456789 python -m pytest tests/layers/test_attention.py::test_name

With ``ATTNLAB_SEED`` set, every test uses that seed, and it is also passed on to hypothesis
as ``--hypothesis-seed`` (unless that is given), so the whole run is deterministic.
Property-based tests draw their own ``seed`` argument for the tensors they build; on failure
hypothesis prints the falsifying example (with that ``seed``) and the ``--hypothesis-seed=N``
that reproduces it.

The device-aware tests run on the device named by ``ATTNLAB_TEST_DEVICE`` (default cpu), with
per-dtype tolerances: both are stated once in tests/_device.py; the fixtures are here.
"""

from __future__ import annotations

import os
import random
import secrets
import shutil

import numpy as np
import pytest
import torch

from _device import DEVICE, DEVICE_ENV

SEED_ENV = "ATTNLAB_SEED"
_SEED_ATTR = "_attnlab_seed"


def _draw_seed() -> int:
    text = os.environ.get(SEED_ENV, "").strip()
    if text:
        try:
            return int(text)
        except ValueError:
            raise pytest.UsageError(f"{SEED_ENV} must be an integer, got {text!r}") from None
    return secrets.randbits(32)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    text = os.environ.get(SEED_ENV, "").strip()
    if text and getattr(config.option, "hypothesis_seed", "absent") is None:
        config.option.hypothesis_seed = text  # read by hypothesis's own pytest_configure


def pytest_report_header(config: pytest.Config) -> list[str]:
    text = os.environ.get(SEED_ENV, "").strip()
    if text:
        seeds = f"attnlab: every test seeded with {SEED_ENV}={text}"
    else:
        seeds = f"attnlab: a fresh random seed per test (replay one with {SEED_ENV}=N)"
    where = str(DEVICE)
    if DEVICE.type == "cuda":
        where += f" ({torch.cuda.get_device_name(DEVICE)}, torch {torch.__version__})"
    return [seeds, f"attnlab: device-aware tests on {where} (set with {DEVICE_ENV})"]


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device under test (tests/_device.py)."""
    return DEVICE


@pytest.fixture
def deterministic(device: torch.device):
    """On CUDA, ask torch for deterministic algorithms (warnings only where it has none), so
    tests that compare two runs bitwise (resume, accumulation) compare like with like."""
    if device.type == "cpu":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.fixture
def on_test_device(device: torch.device, deterministic: None):
    """Run the test with the device under test as torch's default device (no-op on CPU)."""
    if device.type == "cpu":
        yield device
        return
    with torch.device(device):
        yield device


@pytest.fixture(autouse=True)
def seed(request: pytest.FixtureRequest) -> int:
    """Seed torch, numpy and random for this test; the value is also the fixture's value."""
    value = _draw_seed()
    setattr(request.node, _SEED_ATTR, value)
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)
    return value


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread for every test (small tensors everywhere), restored afterwards; set
    per test, so a test that changes the thread count cannot leak it into the next.

    On a shared 2-core machine the OpenMP workers of tiny ops wait on each other whenever a
    core is taken by another job: the attention/blocks/parity suites ran ~10x slower with two
    threads under load than with one.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    value = getattr(item, _SEED_ATTR, None)
    if value is not None and report.failed:
        report.sections.append(
            (
                "attnlab seed",
                f"replay this test with {SEED_ENV}={value} python -m pytest '{item.nodeid}'",
            )
        )
    return report


@pytest.fixture(scope="session")
def browser():
    """Headless Debian chromium driven by Playwright, one for the whole session (Playwright's
    sync API runs one instance a process: the explorer's and the serve page's tests share it)."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; setup.sh --test does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield b
        b.close()
