"""Peak memory (and time) of a training step, measured in a fresh Python process.

CPU: the child builds the case, runs a smaller warm-up step (thread pools, kernel set-up,
autograd engine), resets the peak resident set size (writing "5" to /proc/self/clear_refs
sets VmHWM to VmRSS, Linux), reads VmRSS, runs the measured step and reads VmHWM: the step's
peak is VmHWM - VmRSS. glibc hands large blocks back to the OS when freed, so resident size
tracks live tensors; the number includes allocator slack (an upper bound on tensor bytes).
CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (untested here).
Then it times up to ``repeats`` more steps, stopping once ``time_cap_s`` is spent.

    python -m attnlab.bench.memory '{"case": "block", ...}'   # prints one JSON line
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from attnlab.bench.timing import time_call


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(spec: dict) -> dict:
    """In this process: the peak memory of one step of ``spec``'s case, then step times."""
    from attnlab.bench.cases import build_case

    torch.set_num_threads(spec.get("threads", 1))
    device = torch.device(spec.get("device", "cpu"))
    warmup, step = build_case(spec, device)
    warmup()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        seconds = [time_call(step, device)]
        peak_mib = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        reset = True
    else:
        try:
            Path("/proc/self/clear_refs").write_text("5")
            reset = True
        except OSError:  # then the peak so far is the warm-up's, kept below the step's
            reset = False
        before = _status_kib("VmRSS")
        start = time.perf_counter()
        step()
        seconds = [time.perf_counter() - start]
        peak_mib = (_status_kib("VmHWM") - before) / 1024
    spent = seconds[0]
    while len(seconds) < 1 + spec.get("repeats", 0) and spent < spec.get("time_cap_s", 30.0):
        seconds.append(time_call(step, device))
        spent += seconds[-1]
    timed = seconds[1:] or seconds  # the first step also paid for first-touch page faults
    return {
        "peak_mib": peak_mib,
        "hwm_reset": reset,
        "median_ms": 1e3 * statistics.median(timed),
        "steps_timed": len(timed),
    }


def run_isolated(spec: dict, timeout_s: float = 300.0) -> dict:
    """:func:`measure` in a fresh Python process; ``{"error": ...}`` if it fails or times out."""
    env = {**os.environ, "OMP_NUM_THREADS": str(spec.get("threads", 1))}
    cmd = [sys.executable, "-m", "attnlab.bench.memory", json.dumps(spec)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {out.returncode}: {last}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
