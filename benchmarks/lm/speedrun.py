"""The language-model speedrun on this CPU: time to a validation loss, baby preset vs speedrun.

    python -m benchmarks.lm.speedrun race   [--seeds 0 1 2]
    python -m benchmarks.lm.speedrun budget [--seeds 0] [--minutes 10]
    python -m benchmarks.lm.speedrun ablate [--seed 0] [--tricks muon qk_norm ...]
    python -m benchmarks.lm.speedrun report

Every run is the CLI, `python -m attnlab train lm --config PRESET --num-threads 1 --precision
fp32 --eval-windows W --seed S ...`, in runs/speedrun/PHASE/NAME, `--workers` (2: one per core)
at a time, each next run starting when one ends, so that the runs share the machine:

race    baby and speedrun runs per seed, each stopped by --target-loss (1.88) at the first
        evaluation at or below it. Recorded: the step, the training wall time and the process CPU
        time until then, evaluations left out (the engine's target_step, target_time_s,
        target_cpu_s), and the ratios speedrun / baby per seed. Order: baby seed 0 beside every
        speedrun run, then the other baby runs beside each other.
budget  baby and speedrun for a fixed wall-clock budget, the lr schedule driven by the clock
        (--max-minutes M --schedule-by-time, warmup 5% of it): the best validation loss.
ablate  the speedrun preset with one trick removed (no-X, ABLATIONS) or one it leaves off added
        (with-X, ADDITIONS) per run, each for the preset's whole schedule and evaluated at its
        end: validation loss after the same steps, and CPU time per step.
report  rewrites the markdown from the JSON (--rebuild-race: the race from its run directories).
load    samples the load average every 30 s into runs/speedrun/load_timeline.jsonl until
        killed; started beside the phases, its timeline goes into the JSON.

Validation: the same W = 1000 evenly spaced 64-token windows of the validation split for every
run (--eval-windows 1000; the split has 7,888, a full pass costs ~8x as much per evaluation).
Each phase merges its results into docs/results/lm_speedrun.json and rewrites
docs/results/lm_speedrun.md; the machine, thread count and load averages go with them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import common

RESULTS = Path("docs/results")
OUT_JSON, OUT_MD = RESULTS / "lm_speedrun.json", RESULTS / "lm_speedrun.md"
RUNS = Path("runs/speedrun")
LOAD_TIMELINE = RUNS / "load_timeline.jsonl"  # {"utc", "load"} lines, if a sampler wrote them
TARGET = 1.88
PRESETS = ("baby", "speedrun")
EVAL_WINDOWS = 1000
# Evaluations every ~5% of each preset's schedule, from where the target can first be near
# (training time excludes evaluations; they only cost the benchmark wall-clock time).
EVALS = {
    "baby": ["--eval-every", "100", "--eval-start", "1000"],  # of 2000 steps
    "speedrun": ["--eval-every", "15", "--eval-start", "150"],  # of 300 steps
}
# One trick removed per run: the overrides that turn it off (back to the baby GPT's choice).
ABLATIONS: dict[str, list[str]] = {
    "muon": ["--optimizer", "adamw"],  # AdamW for every tensor, at the preset's lr
    "rope": ["--pos", "learned"],
    "rmsnorm": ["--norm", "layer"],
    "untied": ["--tie-weights", "true"],
    "wsd": ["--schedule", "cosine"],  # same warmup, cosine to min_lr_ratio
    "batch24": ["--batch-size", "12", "--max-steps", "600"],  # the baby's batch, same tokens
    "qk_norm": ["--qk-norm", "false"],
    "relu2": ["--activation", "gelu"],
    "value_embeddings": ["--value-embeddings", "false"],
    "zero_init_proj": ["--zero-init-proj", "false"],
}
# The four GPT switches together (on or off), for runs on a preset without (or with) them.
FOUR = ("qk_norm", "relu2", "value_embeddings", "zero_init_proj")
ABLATIONS["all4"] = [x for t in FOUR for x in ABLATIONS[t]]
ADDITIONS: dict[str, list[str]] = {
    "all4": ["--qk-norm", "true", "--activation", "relu2", "--value-embeddings", "true"]
    + ["--zero-init-proj", "true"]
}


def cli(preset: str, out: Path, seed: int, extra: list[str]) -> list[str]:
    """The `attnlab train lm` command line of one run."""
    args = [sys.executable, "-m", "attnlab", "train", "lm", "--config", preset]
    args += ["--out", str(out), "--seed", str(seed), "--num-threads", "1", "--precision", "fp32"]
    args += ["--eval-windows", str(EVAL_WINDOWS), "--sample-tokens", "0", "--tensorboard", "false"]
    return args + EVALS[preset] + extra


def start(job: tuple[str, str, Path, int, list[str]]) -> dict[str, Any]:
    """Launch one (name, preset, run_dir, seed, extra args) run; return its handle."""
    name, preset, out, seed, extra = job
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = cli(preset, out, seed, extra)
    log = open(out.parent / f"{out.name}.log", "w")  # noqa: SIM115 - closed by finish()
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    print(f"[speedrun] start {name}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return {"job": job, "cmd": cmd, "proc": proc, "log": log, "load": os.getloadavg()}


def finish(handle: dict[str, Any]) -> dict[str, Any]:
    """Wait for a run; return its record (`read_record` plus the load averages)."""
    name, preset, out, seed, extra = handle["job"]
    code = handle["proc"].wait()
    handle["log"].close()
    if code != 0:
        tail = (out.parent / f"{out.name}.log").read_text()[-2000:]
        raise RuntimeError(f"run {name} failed with exit code {code}:\n{tail}")
    record = read_record(handle["job"])
    record["load_average_start"] = list(handle["load"])
    record["load_average_end"] = common.load_average()
    print(f"[speedrun] done {name}: {brief(record)}", file=sys.stderr, flush=True)
    return record


def read_record(job: tuple[str, str, Path, int, list[str]]) -> dict[str, Any]:
    """A finished run's record: command, summary, val curve, tokens and ms per step."""
    name, preset, out, seed, extra = job
    summary = json.loads((out / "summary.json").read_text())
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_steps = summary["steps"]
    return {
        "name": name,
        "preset": preset,
        "seed": seed,
        "overrides": extra,
        "command": "python -m attnlab " + " ".join(cli(preset, out, seed, extra)[3:]),
        "summary": {k: v for k, v in summary.items() if k != "run_dir"},
        "tokens_per_step": tokens_per_step(out),
        "val_curve": [[m["step"], round(m["val_loss"], 4)] for m in metrics if m["split"] == "val"],
        "ms_per_step_wall": 1000 * (summary["wall_time_s"] - summary["eval_time_s"]) / train_steps,
        "ms_per_step_cpu": 1000 * (summary["cpu_time_s"] - summary["eval_cpu_s"]) / train_steps,
    }


def run_jobs(
    jobs: list[tuple[str, str, Path, int, list[str]]],
    workers: int,
    on_done: Any = None,
) -> list[dict]:
    """Run the jobs `workers` at a time (each next job starts when a run ends); return the
    records in job order. `on_done(records so far)` is called after every finished run."""
    pending, running, done = list(jobs), [], {}
    while pending or running:
        while pending and len(running) < workers:
            running.append(start(pending.pop(0)))
        time.sleep(2)
        for handle in [h for h in running if h["proc"].poll() is not None]:
            running.remove(handle)
            done[handle["job"][0]] = finish(handle)
            if on_done is not None:
                on_done([done[job[0]] for job in jobs if job[0] in done])
    return [done[job[0]] for job in jobs]


def brief(r: dict[str, Any]) -> str:
    s = r["summary"]
    if s["target_reached"]:
        return (
            f"target at step {s['target_step']}, {s['target_time_s']:.1f} s wall, "
            f"{s['target_cpu_s']:.1f} s CPU; best {s['best_metric']:.4f}"
        )
    return f"target not reached in {s['steps']} steps; best {s['best_metric']:.4f}"


def spread(values: list[float]) -> dict[str, float]:
    """Median, min, max (and mean) of a list of ratios or times."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "mean": statistics.fmean(values),
        "n": len(values),
    }


def race_jobs(seeds: list[int], baby_seeds: list[int]) -> list[tuple]:
    """The race's runs: the baby seeds first, then the speedrun seeds; all stop at the target."""
    target = ["--target-loss", str(TARGET)]
    jobs = [(f"baby-s{s}", "baby", RUNS / "race" / f"baby-s{s}", s, target) for s in baby_seeds]
    return jobs + [
        (f"speedrun-s{s}", "speedrun", RUNS / "race" / f"speedrun-s{s}", s, target) for s in seeds
    ]


def race(seeds: list[int], baby_seeds: list[int], workers: int) -> dict[str, Any]:
    """Baby and speedrun runs per seed, both stopped at the target; the baby runs first."""
    return race_result(seeds, baby_seeds, run_jobs(race_jobs(seeds, baby_seeds), workers))


def race_result(seeds: list[int], baby_seeds: list[int], runs: list[dict]) -> dict[str, Any]:
    """The race's runs with the ratios speedrun / baby of the times to the target. A baby run
    that misses the target within its schedule counts with its whole training time, a lower
    bound on its time to the target, so the ratios with it are upper bounds ("<=")."""
    by = {(r["preset"], r["seed"]): r["summary"] for r in runs}
    seeds = [s for s in seeds if ("speedrun", s) in by]  # a rebuilt race may lack runs
    baby_seeds = [s for s in baby_seeds if ("baby", s) in by]
    whole = {"target_time_s": ("wall_time_s", "eval_time_s"), "target_cpu_s": ("cpu_time_s",
             "eval_cpu_s"), "target_step": ("steps", None)}  # fmt: skip
    ratios: dict[str, Any] = {}
    for key, (total, evals) in whole.items():
        fast = [by[("speedrun", s)][key] for s in seeds]
        if None in fast or not fast or not baby_seeds:
            ratios[key] = None  # a speedrun run missed the target; see the runs
            continue
        slow, exact = [], []
        for s in baby_seeds:
            b = by[("baby", s)]
            exact.append(b[key] is not None)
            slow.append(b[key] if b[key] is not None else b[total] - (b[evals] if evals else 0))
        both = [s for s in baby_seeds if s in seeds]
        per_seed = [
            {
                "seed": s,
                "ratio": by[("speedrun", s)][key] / slow[baby_seeds.index(s)],
                "bound": "exact" if exact[baby_seeds.index(s)] else "upper",
            }
            for s in both
        ]
        ratios[key] = {
            "per_seed": per_seed,  # seeds run by both presets
            "ratio_of_medians": statistics.median(fast) / statistics.median(slow),
            "ratio_of_medians_bound": "exact" if all(exact) else "upper",
            "speedrun": spread(fast),
            "baby": spread(slow),
            "baby_reached": exact,
        }
    return {
        "seeds": seeds,
        "baby_seeds": baby_seeds,
        "runs": runs,
        "ratios_speedrun_over_baby": ratios,
    }


def rebuild_race(seeds: list[int], baby_seeds: list[int]) -> dict[str, Any]:
    """The race from the finished run directories (when its process could not finish: the
    load averages per run are then unknown; see the load timeline). Runs of the preset as it
    was before the four GPT switches were added (`speedrun_v1-sN`: today's preset with
    ABLATIONS["all4"]) are kept apart as `earlier_runs`."""
    unknown = {"load_average_start": None, "load_average_end": None}
    jobs = [j for j in race_jobs(seeds, baby_seeds) if (j[2] / "summary.json").exists()]
    runs = [read_record(j) | unknown for j in jobs]
    target = ["--target-loss", str(TARGET)]
    earlier = [
        read_record((d.name, "speedrun", d, int(d.name.rsplit("-s", 1)[1]), ABLATIONS["all4"]
                     + target)) | unknown
        for d in sorted((RUNS / "race").glob("speedrun_v1-s*"))
        if (d / "summary.json").exists()
    ]  # fmt: skip
    result = race_result(seeds, baby_seeds, runs)
    return result | {"earlier_runs": earlier, "rebuilt_from_run_dirs": True}


def budget(seeds: list[int], minutes: float, workers: int) -> dict[str, Any]:
    """Best validation loss in a fixed wall-clock budget, schedule following the clock."""
    extra = [
        "--max-minutes", str(minutes), "--schedule-by-time", "true", "--max-steps", "100000",
        "--warmup-steps", "0", "--warmup-ratio", "0.05", "--eval-every", "250",
    ]  # fmt: skip
    jobs = [
        (f"{p}-s{s}", p, RUNS / "budget" / f"{p}-s{s}", s, extra) for s in seeds for p in PRESETS
    ]
    return {"minutes": minutes, "seeds": seeds, "overrides": extra, "runs": run_jobs(jobs, workers)}


def ablation_job(name: str, seed: int) -> tuple[str, str, Path, int, list[str]]:
    """`full`, `no-A+B` (tricks A and B removed, ABLATIONS) or `with-A` (added, ADDITIONS): the
    speedrun preset for its whole schedule, evaluated once at the end (--eval-start 100000)."""
    extra: list[str] = []
    if name != "full":
        kind, _, tricks = name.partition("-")
        table = ABLATIONS if kind == "no" else ADDITIONS
        extra = [x for t in tricks.split("+") for x in table[t]]
    return (name, "speedrun", RUNS / "ablate" / name, seed, extra + ["--eval-start", "100000"])


def ablate(
    seed: int, names: list[str], workers: int, save: Any, skip_done: bool = False
) -> dict[str, Any]:
    """The full preset, then the named variants (`ablation_job`); partial results are saved
    after every run. With `skip_done`, runs whose directory holds a summary are read, not rerun."""
    jobs = [ablation_job(n, seed) for n in ["full", *names]]
    done = [j for j in jobs if skip_done and (j[2] / "summary.json").exists()]
    unknown = {"load_average_start": None, "load_average_end": None}
    earlier = [read_record(j) | unknown for j in done]
    result: dict[str, Any] = {"seed": seed, "jobs": names, "runs_at_once": workers}

    def partial(runs: list[dict]) -> None:
        save({"ablate": result | {"runs": earlier + runs, "complete": False}})

    runs = run_jobs([j for j in jobs if j not in done], workers, partial)
    return result | {"runs": earlier + runs, "complete": True}


def rebuild_ablate(seed: int, workers: int) -> dict[str, Any]:
    """The ablation from the finished run directories under runs/speedrun/ablate."""
    names = sorted(p.name for p in (RUNS / "ablate").iterdir() if (p / "summary.json").exists())
    names = ["full"] + [n for n in names if n != "full"]
    runs = [
        read_record(ablation_job(n, seed)) | {"load_average_start": None, "load_average_end": None}
        for n in names
    ]
    return {"seed": seed, "jobs": names[1:], "runs_at_once": workers, "runs": runs,
            "complete": True, "rebuilt_from_run_dirs": True}  # fmt: skip


def sample_best(race_result: dict[str, Any]) -> dict[str, Any]:
    """500 characters (temperature 0.8, seed 0) from the race run with the lowest val loss."""
    import torch

    from attnlab.infer.lm import LMRun, generate_text

    if not race_result["runs"]:
        return {}
    best = min(race_result["runs"], key=lambda r: r["summary"]["best_metric"])
    torch.set_num_threads(1)
    run = LMRun.load(RUNS / "race" / best["name"])
    text = generate_text(run.model, run.tokenizer, "\n", 500, temperature=0.8, seed=0)
    return {"run": best["name"], "val_loss": best["summary"]["best_metric"], "text": text.texts[0]}


# ---------------------------------------------------------------------------- report


def tokens_per_step(run_dir: Path) -> int:
    """Training tokens per optimizer step of a finished run (batch x context)."""
    config = json.loads((run_dir / "config.json").read_text())
    return config["train"]["batch_size"] * config["model"]["context"]


def loads(run: dict[str, Any]) -> str:
    """'start→end' 1-minute load averages of a run, or — when not recorded."""
    if run.get("load_average_start") is None:
        return "—"
    return f"{run['load_average_start'][0]:.1f}→{run['load_average_end'][0]:.1f}"


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "—" if x is None else format(x, spec)


def write_markdown(res: dict[str, Any]) -> None:
    m = res["machine"]
    lines = [
        "# LM speedrun: time to validation loss 1.88 (`benchmarks/lm/speedrun.py`)",
        "",
        "Character-level Shakespeare, default split; validation loss over the same "
        f"{EVAL_WINDOWS} evenly spaced 64-character windows of the validation split for every "
        "run. Presets: `baby` (nanoGPT's CPU baby GPT, `presets/lm_baby.toml`) and `speedrun` "
        "(`presets/lm_speedrun.toml`). Every run is the CLI with one torch thread, fp32, several "
        "runs at a time on the shared machine.",
        "",
        f"Machine: {m['cpu']}, {m['logical_cores']} logical CPUs shared with other agents' jobs; "
        f"torch {m['torch']}, 1 thread per run. Load averages (1 min) at each run's start and "
        "end are below, more in the JSON. Times leave evaluations out; *CPU* is the process CPU "
        "time "
        "(`time.process_time`), which the other jobs' load disturbs far less than wall time.",
        "",
    ]
    timeline = res.get("load_timeline") or []
    if timeline:
        one = [t["load"][0] for t in timeline]
        lines += [
            f"Load average (1 min) sampled every 30 s from {timeline[0]['utc']} to "
            f"{timeline[-1]['utc']} UTC: median {statistics.median(one):.1f}, min {min(one):.1f}, "
            f"max {max(one):.1f} (on 2 logical CPUs).",
            "",
        ]
    if "race" in res:
        r = res["race"]
        lines += [
            f"## Race to {TARGET}",
            "",
            f"Speedrun seeds {', '.join(map(str, r['seeds']))}, baby seeds "
            f"{', '.join(map(str, r['baby_seeds']))}, all on the shared machine at overlapping "
            "times (see docs/speedrun.md for the order). Evaluations: baby every 100 steps from "
            "step 1000, speedrun every 15 from step 150 (about 5% of each schedule); each run "
            "stops at the first evaluation at or below "
            f"{TARGET}.",
            "",
            "| run | target step | tokens | wall s | CPU s | ms/step (wall) | ms/step (CPU) | "
            "best val | load start→end |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for run in r["runs"] + r.get("earlier_runs", []):
            s = run["summary"]
            per_step = run.get("tokens_per_step") or tokens_per_step(RUNS / "race" / run["name"])
            tokens = s["target_step"] * per_step if s["target_step"] else None
            lines.append(
                f"| {run['name']} | {s['target_step'] or 'not reached'} | "
                f"{fmt(tokens, ',')} | {fmt(s['target_time_s'])} | {fmt(s['target_cpu_s'])} | "
                f"{run['ms_per_step_wall']:.0f} | {run['ms_per_step_cpu']:.0f} | "
                f"{s['best_metric']:.4f} | {loads(run)} |"
            )
        if r.get("earlier_runs"):
            lines += [
                "",
                "`speedrun_v1-*`: the preset before QK-norm, ReLU², value embeddings and zero-init "
                "projections were added (today's preset with `"
                + " ".join(ABLATIONS["all4"])
                + "`).",
            ]
        lines += ["", "Ratios speedrun / baby:", ""]
        for key, label in (
            ("target_time_s", "wall time to target"),
            ("target_cpu_s", "CPU time to target"),
        ):
            q = r["ratios_speedrun_over_baby"][key]
            if q is None:
                lines.append(f"- {label}: a run missed the target")
                continue
            per = ", ".join(
                f"seed {p['seed']} {'≤ ' if p['bound'] == 'upper' else ''}{p['ratio']:.3f}"
                for p in q["per_seed"]
            )
            bounded = q["ratio_of_medians_bound"] == "upper"
            le, ge = ("≤ ", "≥ ") if bounded else ("", "")
            lines.append(
                f"- {label}: ratio of the medians **{le}{q['ratio_of_medians']:.3f}** (speedrun "
                f"median {q['speedrun']['median']:.1f} s, range {q['speedrun']['min']:.1f}–"
                f"{q['speedrun']['max']:.1f}; baby median {ge}{q['baby']['median']:.1f} s, range "
                f"{q['baby']['min']:.1f}–{q['baby']['max']:.1f}); per seed: {per}"
            )
        cpu = r["ratios_speedrun_over_baby"].get("target_cpu_s") or {}
        if not all(cpu.get("baby_reached", [True])):
            lines.append(
                "- ≤: a baby run that did not reach the target in its 2000 steps counts with its "
                "whole training time (a lower bound on its time to the target)."
            )
        lines.append("")
    if "budget" in res:
        b = res["budget"]
        lines += [
            f"## Best validation loss in {b['minutes']:g} minutes (seeds "
            f"{', '.join(map(str, b['seeds']))})",
            "",
            "Overrides for both: `" + " ".join(b["overrides"]) + "`.",
            "",
            "| run | steps | best val | best step | load start→end |",
            "|---|---|---|---|---|",
        ]
        for run in b["runs"]:
            s = run["summary"]
            lines.append(
                f"| {run['name']} | {s['steps']} | {s['best_metric']:.4f} | {s['best_step']} | "
                f"{loads(run)} |"
            )
        lines.append("")
    if "ablate" in res:
        a = res["ablate"]
        fulls = [r["summary"]["best_metric"] for r in a["runs"] if r["name"] == "full"]
        lines += [
            f"## Ablation (seed {a['seed']}; one trick removed (no-X) or added (with-X) per run; "
            f"every run its whole schedule, evaluated at the end; {a['runs_at_once']} at once)"
            + ("" if a.get("complete", True) else " — incomplete: the runs that finished"),
            "",
            "| run | overrides | steps | val loss at the end | vs full | training CPU s | "
            "ms/step (CPU) |",
            "|---|---|---|---|---|---|---|",
        ]
        for run in a["runs"]:
            s = run["summary"]
            over = " ".join(x for x in run["overrides"] if x not in ("--eval-start", "100000"))
            lines.append(
                f"| {run['name']} | `{over or '(preset)'}` | {s['steps']} | "
                f"{s['best_metric']:.4f} | "
                f"{fmt(s['best_metric'] - fulls[0] if fulls else None, '+.4f')} | "
                f"{s['cpu_time_s'] - s['eval_cpu_s']:.0f} | {run['ms_per_step_cpu']:.0f} |"
            )
        lines.append("")
    if res.get("sample"):
        smp = res["sample"]
        lines += [
            f"## Sample from the best run ({smp['run']}, val {smp['val_loss']:.4f}; 500 "
            "characters, temperature 0.8, seed 0)",
            "",
            "```",
            smp["text"].strip("\n"),
            "```",
            "",
        ]
    module = "python -m benchmarks.lm.speedrun"
    stages = ("race", "ablate", "budget", "report")
    common.write_page(OUT_MD, lines, "; ".join(f"{module} {stage}" for stage in stages))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("race", "budget", "ablate", "report", "load"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--baby-seeds",
        type=int,
        nargs="*",
        default=None,
        help="race: the baby preset's seeds (default: --seeds)",
    )
    parser.add_argument("--seed", type=int, default=0, help="ablate: the seed")
    parser.add_argument("--minutes", type=float, default=10.0, help="budget: minutes per run")
    choices = [f"no-{t}" for t in ABLATIONS]
    parser.add_argument("--jobs", nargs="+", default=choices, help="ablate: no-A+B, with-A")
    parser.add_argument(
        "--rebuild-race", action="store_true", help="report: the race from its run directories"
    )
    parser.add_argument(
        "--skip-done", action="store_true", help="ablate: read runs already finished, not rerun"
    )
    parser.add_argument(
        "--rebuild-ablate", action="store_true", help="report: the ablation from its run dirs"
    )
    parser.add_argument("--workers", type=int, default=2, help="runs at once (one thread each)")
    args = parser.parse_args(argv)
    if args.phase == "load":  # run beside the others; stop it with kill
        RUNS.mkdir(parents=True, exist_ok=True)
        with LOAD_TIMELINE.open("a") as f:
            while True:
                utc = time.strftime("%H:%M:%S", time.gmtime())
                f.write(json.dumps({"utc": utc, "load": os.getloadavg()}) + "\n")
                f.flush()
                time.sleep(30)
    info = common.machine()
    start = time.perf_counter()

    def save(new: dict[str, Any]) -> None:
        """Merge `new` phases into the JSON (read now: another phase may have written) and
        rewrite the markdown."""
        res = json.loads(OUT_JSON.read_text()) if OUT_JSON.exists() else {}
        res.setdefault("machine", info)
        res |= new
        if LOAD_TIMELINE.exists():  # written by a sampler beside the runs, if one was started
            lines = LOAD_TIMELINE.read_text().splitlines()
            res["load_timeline"] = [json.loads(line) for line in lines]
        RESULTS.mkdir(parents=True, exist_ok=True)
        OUT_JSON.write_text(json.dumps(res, indent=2) + "\n")
        write_markdown(res)

    new: dict[str, Any] = {}
    baby_seeds = args.seeds if args.baby_seeds is None else args.baby_seeds
    if args.phase == "race":
        new["race"] = race(args.seeds, baby_seeds, args.workers)
        new["sample"] = sample_best(new["race"])
    elif args.phase == "budget":
        new["budget"] = budget(args.seeds, args.minutes, args.workers)
    elif args.phase == "ablate":
        new["ablate"] = ablate(args.seed, args.jobs, args.workers, save, args.skip_done)
    if args.phase == "report" and args.rebuild_race:
        new["race"] = rebuild_race(args.seeds, baby_seeds)
        new["sample"] = sample_best(new["race"])
    if args.phase == "report" and args.rebuild_ablate:
        new["ablate"] = rebuild_ablate(args.seed, args.workers)
    if args.phase != "report":
        new[args.phase] |= {
            "phase_wall_s": time.perf_counter() - start,
            "threads_per_run": 1,
            "runs_at_once": args.workers,
            "machine": info | {"load_average_at_end": common.load_average()},
        }
    save(new)
    print(OUT_MD.read_text())


if __name__ == "__main__":
    main()
