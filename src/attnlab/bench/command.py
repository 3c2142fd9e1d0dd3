"""``attnlab bench``: run the suites, write one markdown report (and its JSON beside it)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from attnlab.bench import DEFAULT_OUT, SECTIONS, suites
from attnlab.bench.machine import machine_info, matmul_peak_gflops, precision_info
from attnlab.bench.report import render
from attnlab.bench.scaling import run_scaling
from attnlab.data.io import check_file_target
from attnlab.errors import UserError
from attnlab.train.config import check_num_threads

# (quick, full) settings of every section
PLAN = {
    "rounds": (3, 10),
    "kernel_T": (512, 2048),
    "mha_shape": ((4, 256), (8, 512)),
    "encoder_shape": ((4, 128), (8, 256)),
    "gpt_shape": ((4, 4, 128, 64, 12), (6, 6, 384, 256, 12)),
    "new_tokens": (50, 200),
    "e5_shape": ((4, 32), (16, 64)),
    "scaling_T": ([256, 512, 1024], [512, 1024, 2048, 4096, 8192]),
}


def report_path(out: str | Path) -> Path:
    """The report's .md path; its data goes beside it, with .json.

    An existing folder, or a path ending in "/", gets DEFAULT_OUT inside (beside it, DIR.md
    and DIR.json would name no file the user asked for); FILE or FILE.md is FILE.md. Any other
    suffix, a target that is a folder, or a path through a file is refused before the run."""
    path = Path(out)
    if path.is_dir() or str(out).endswith(("/", os.sep)):
        path = path / DEFAULT_OUT
    elif path.suffix not in ("", ".md"):
        raise UserError(
            f"--out {out}: the report is markdown; give FILE.md (its data goes beside it as "
            "FILE.json) or a folder"
        )
    else:
        path = path.with_suffix(".md")
    for target in (path, path.with_suffix(".json")):
        check_file_target(target, "--out")
    return path


def run_bench(
    out: str | Path = DEFAULT_OUT,
    quick: bool = False,
    device: str = "cpu",
    threads: int = 1,
    sections: tuple[str, ...] = SECTIONS,
    log=print,
) -> Path:
    """Run ``sections``, write the report to ``out`` (.md) and ``out`` with .json; return it."""
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise UserError(f"unknown bench sections {sorted(unknown)}; choose from {SECTIONS}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda, but torch sees no CUDA device; use --device cpu")
    check_num_threads(threads)
    out = report_path(out)
    if threads > 0:
        torch.set_num_threads(threads)
    dev = torch.device(device)
    pick = {k: v[0] if quick else v[1] for k, v in PLAN.items()}
    rounds = pick["rounds"]
    start = time.perf_counter()
    results: dict = {
        "machine": machine_info(device),
        "matmul_peak_gflops": matmul_peak_gflops(device),
        "precision": precision_info(device),
        "timer": "CUDA events (untested)" if dev.type == "cuda" else "time.perf_counter",
        "flags": (" --quick" if quick else "")
        + f" --num-threads {threads}"
        + (f" --device {device}" if device != "cpu" else "")
        + (f" --only {','.join(sections)}" if tuple(sections) != SECTIONS else ""),
        "sections": {},
    }
    runners = {
        "kernels": lambda: suites.bench_kernels(dev, rounds, pick["kernel_T"]),
        "mha": lambda: suites.bench_mha(dev, rounds, *pick["mha_shape"]),
        "encoder_layer": lambda: suites.bench_encoder_layer(dev, rounds, *pick["encoder_shape"]),
        "gpt_step": lambda: suites.bench_gpt_step(dev, rounds, pick["gpt_shape"]),
        "generation": lambda: suites.bench_generation(dev, max(1, rounds // 2), pick["new_tokens"]),
        "e5_step": lambda: suites.bench_e5_step(dev, max(2, rounds // 2), pick["e5_shape"]),
        "scaling": lambda: run_scaling(
            pick["scaling_T"],
            threads=torch.get_num_threads(),
            device=device,
            repeats=1 if quick else 2,
            time_cap_s=10.0 if quick else 60.0,
            fit_from=512,
            log=log,
        ),
    }
    for name in sections:
        t0 = time.perf_counter()
        log(f"bench {name} ...")
        results["sections"][name] = runners[name]()
        log(f"  done in {time.perf_counter() - t0:.1f} s")
    results["wall_s"] = time.perf_counter() - start
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    out.write_text(render(results) + "\n")
    return out
