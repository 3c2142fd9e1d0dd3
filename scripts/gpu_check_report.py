"""The bookkeeping of scripts/gpu_check.sh: the environment report, one result file per
stage, and the closing summary. Standard library only, except `env`, which imports torch.

    python3 scripts/gpu_check_report.py env OUT DEVICE            -> OUT/env.json, OUT/env.md
    python3 scripts/gpu_check_report.py stage OUT NAME RC MILLISECONDS LIMIT EXPECT [NOTE] -- CMD
                                                                  -> OUT/results/NAME.json
    python3 scripts/gpu_check_report.py summary OUT MODE BUDGET_S  -> OUT/summary.{json,md}

A stage is "ok" when its command exited 0 and wrote every file of EXPECT (comma-separated,
relative to OUT); "timeout" when `timeout` stopped it (exit 124, or 137 after the kill);
"skipped" when the budget had no room left for it (RC = -1); else "failed".
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

TAIL_LINES = 15


def _run(cmd: list[str]) -> str:
    """Output of a command, or why it could not run."""
    if shutil.which(cmd[0]) is None:
        return f"{cmd[0]}: not found"
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return f"{' '.join(cmd)}: timed out"
    return (out.stdout + out.stderr).strip()


def env_report(out: Path, device: str) -> dict:
    """What the run is on: GPU (nvidia-smi and torch's view), torch and CUDA versions, bf16,
    TF32 flags, the fused attention kernels torch may use, the CPU and its load."""
    import torch

    from attnlab.bench.machine import cpu_model
    from attnlab.train.precision import choose_precision

    info: dict = {
        "requested_device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "nvidia_smi": _run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm",
                "--format=csv",
            ]
        ),
    }
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        props = torch.cuda.get_device_properties(dev)
        info |= {
            "gpu": torch.cuda.get_device_name(dev),
            "gpu_count": torch.cuda.device_count(),
            "compute_capability": list(torch.cuda.get_device_capability(dev)),
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "cudnn": torch.backends.cudnn.version(),
            "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False),
            "tf32_matmul_default": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn_default": torch.backends.cudnn.allow_tf32,
            "sdpa_backends_enabled": {
                "flash": torch.backends.cuda.flash_sdp_enabled(),
                "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                "math": torch.backends.cuda.math_sdp_enabled(),
            },
        }
    try:
        dtype, reason = choose_precision(device, "auto")
        info["auto_precision_candidate"] = {"dtype": str(dtype), "reason": reason}
    except (RuntimeError, ValueError) as err:
        info["auto_precision_candidate"] = {"error": str(err)}
    (out / "env.json").write_text(json.dumps(info, indent=2) + "\n")
    lines = ["# Environment", ""] + [f"- **{k}**: `{v}`" for k, v in info.items()]
    (out / "env.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(info, indent=2))
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"{device} requested, but torch {torch.__version__} sees no GPU", file=sys.stderr)
        raise SystemExit(2)
    return info


def _tests_details(out: Path) -> dict:
    """Counts from the JUnit XML pytest wrote (tests stage)."""
    xml = out / "tests" / "junit.xml"
    if not xml.exists():
        return {}
    suites = ET.parse(xml).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    if suite is None:
        return {}
    keys = ("tests", "failures", "errors", "skipped", "time")
    return {k: float(suite.get(k, 0)) if k == "time" else int(suite.get(k, 0)) for k in keys}


def stage_result(
    out: Path, name: str, rc: int, seconds: float, limit: int, expect: str, note: str, cmd: list
) -> dict:
    """Write OUT/results/NAME.json for one stage and return it."""
    log = out / "logs" / f"{name}.log"
    tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:] if log.exists() else []
    outputs = {p: (out / p).exists() for p in expect.split(",") if p}
    if rc == -1:
        status = "skipped"
    elif rc in (124, 137):
        status = "timeout"
    elif rc == 0 and all(outputs.values()):
        status = "ok"
    else:
        status = "failed"
    result = {
        "stage": name,
        "status": status,
        "exit_code": rc,
        "seconds": round(seconds, 1),
        "limit_s": limit,
        "command": " ".join(cmd),
        "log": str(log.relative_to(out)),
        "outputs": outputs,
        "note": note,
        "log_tail": tail,
    }
    if name == "tests":
        result["details"] = _tests_details(out)
    (out / "results").mkdir(exist_ok=True)
    (out / "results" / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"[gpu_check] {name}: {status} (exit {rc}, {seconds:.0f} s of {limit} s)", flush=True)
    return result


def summary(out: Path, mode: str, budget_s: int) -> int:
    """OUT/summary.json and OUT/summary.md from the stage results, in the order they ran."""
    results = [json.loads(p.read_text()) for p in (out / "results").glob("*.json")]
    order = (out / "stages.txt").read_text().split() if (out / "stages.txt").exists() else []
    results.sort(key=lambda r: order.index(r["stage"]) if r["stage"] in order else len(order))
    env = json.loads((out / "env.json").read_text()) if (out / "env.json").exists() else {}
    total = sum(r["seconds"] for r in results)
    ok = all(r["status"] == "ok" for r in results)
    where = env.get("gpu") or f"CPU: {env.get('cpu', platform.machine())}"
    data = {
        "mode": mode,
        "device": where,
        "torch": env.get("torch"),
        "budget_s": budget_s,
        "total_s": round(total, 1),
        "all_ok": ok,
        "finished_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "stages": [
            {k: r[k] for k in ("stage", "status", "exit_code", "seconds", "limit_s")}
            for r in results
        ],
    }
    (out / "summary.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [
        f"# attnlab GPU check — {mode}",
        "",
        f"Device: **{where}**; torch {env.get('torch')} "
        f"(CUDA build {env.get('torch_cuda_build')}); "
        f"finished {data['finished_utc']} UTC; {total:.0f} s of a {budget_s} s budget; "
        f"load average at start {env.get('load_average')}.",
        "",
        "| stage | status | exit | seconds | limit (s) | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        note = r["note"]
        if r["stage"] == "tests" and r.get("details"):
            d = r["details"]
            note = (
                f"{d['tests']} tests: {d['failures']} failed, {d['errors']} errors, "
                f"{d['skipped']} skipped; {note}"
            ).rstrip("; ")
        lines.append(
            f"| {r['stage']} | {r['status']} | {r['exit_code']} | {r['seconds']} | "
            f"{r['limit_s']} | {note} |"
        )
    lines += ["", "Per stage: `results/STAGE.json` (command, outputs, log tail), `logs/STAGE.log`."]
    for r in results:
        if r["status"] != "ok":
            lines += ["", f"## {r['stage']}: {r['status']}", "", "```", *r["log_tail"], "```"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "env":
        env_report(Path(rest[0]), rest[1])
        return 0
    if command == "stage":
        cut = rest.index("--")
        args, cmd = rest[:cut], rest[cut + 1 :]
        out, name, rc, millis, limit, expect = args[:6]
        note = args[6] if len(args) > 6 else ""
        stage_result(Path(out), name, int(rc), int(millis) / 1e3, int(limit), expect, note, cmd)
        return 0
    if command == "summary":
        return summary(Path(rest[0]), rest[1], int(rest[2]))
    print(f"unknown command {command!r}; one of env, stage, summary", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
