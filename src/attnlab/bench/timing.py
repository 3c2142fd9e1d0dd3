"""Interleaved timing: every round runs each contender once, in a rotating order.

Load from other jobs then hits all contenders alike; a ratio taken *within* each round and
its median over rounds is the robust number. On CUDA each call is timed with CUDA events
(``torch.cuda.Event(enable_timing=True)``) around the call, then synchronised; on CPU with
``time.perf_counter``. (The CUDA path is written but untested: no GPU was available.)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def time_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes on ``device``."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3
    start_s = time.perf_counter()
    fn()
    return time.perf_counter() - start_s


def interleaved(
    contenders: dict[str, Callable[[], object]],
    rounds: int,
    device: torch.device,
    warmup: int = 1,
) -> dict[str, list[float]]:
    """Per-round seconds of each contender, after ``warmup`` untimed rounds."""
    names = list(contenders)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            t = time_call(contenders[name], device)
            if r >= warmup:
                samples[name].append(t)
    return samples


def median_ms(samples: dict[str, list[float]]) -> dict[str, float]:
    """Median milliseconds per contender."""
    return {n: 1e3 * statistics.median(s) for n, s in samples.items()}


def paired_ratio(samples: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of time(a) / time(b) within the round."""
    return statistics.median(x / y for x, y in zip(samples[a], samples[b], strict=True))
