"""What a benchmark ran on: CPU model, threads, versions, load, matmul peak and precision."""

from __future__ import annotations

import os
import platform
import time

import torch

from attnlab.train.precision import choose_precision, precision_name
from attnlab.train.precision_record import cpu_model


def machine_info(device: str = "cpu") -> dict:
    """CPU, cores, torch threads and version, Python, load average, and the GPU if used."""
    info = {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device,
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if torch.device(device).type == "cuda":
        dev = torch.device(device)
        info |= {
            "gpu": torch.cuda.get_device_name(dev),
            "compute_capability": list(torch.cuda.get_device_capability(dev)),
            "gpu_memory_gib": round(torch.cuda.get_device_properties(dev).total_memory / 2**30, 1),
            "torch_cuda_build": torch.version.cuda,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,  # fp32 timings: IEEE unless on
        }
    return info


def matmul_peak_gflops(device: str = "cpu", sizes: tuple[int, ...] = (1024, 2048)) -> float:
    """Best float32 GFLOP/s over square matmuls of ``sizes`` (3 timed runs each)."""
    dev = torch.device(device)
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
        a @ b  # warm-up
        for _ in range(3):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            start = time.perf_counter()
            a @ b
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            best = max(best, 2 * n**3 / (time.perf_counter() - start) / 1e9)
    return best


def precision_info(device: str = "cpu") -> dict:
    """The precision ``precision=auto`` picks here (train/precision.py) and why."""
    dtype, reason = choose_precision(device, "auto")
    return {"auto": precision_name(dtype), "reason": reason}
