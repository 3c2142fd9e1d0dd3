"""The one runner: every step that all tasks share, written once.

``train(task, out, overrides, preset, resume, device)``:
  1. build the config (defaults <- the task's preset <- a user preset <- the command line), or
     on ``--resume`` read the saved one and accept only the changes that are safe to resume
     with; validate everything before a file is written;
  2. take the run directory: a new run is assembled in a staging folder and renamed into place,
     a resumed one is locked (one writer at a time, see :mod:`attnlab.runs.folder`);
  3. the task prepares its data; the runner writes config.json and the task's files, seeds,
     builds the model and hands everything to the engine (exact resume, DDP, precision);
  4. rank 0 reloads the best weights, asks the task for its results and writes results.json.
Under torchrun only rank 0 writes; the other ranks prepare their data in a private folder.
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from attnlab.configs import apply_overrides, from_dict, load_toml, to_dict
from attnlab.data.io import read_json, write_json
from attnlab.errors import UserError
from attnlab.runs import datafiles, folder, sections
from attnlab.runs.registry import get_task
from attnlab.runs.task import RESUMABLE_FIELDS, RunConfig, Task

DIVERGED = "diverged.json"  # written when training diverged; allows a resume with another lr
FREE = "free space or choose another --out"
DIVERGED_FIELDS = frozenset({"lr", "muon_lr", "clip_norm", "warmup_steps", "warmup_ratio"})


def build_config(
    task: Task | str, preset: str | Path | None, overrides: Mapping[str, Any]
) -> RunConfig:
    """A new run's config: defaults <- the task's bundled presets <- ``preset`` <- fields.

    ``overrides["arch"]`` (``--arch``) chooses the architecture of a task that has several
    (``task.archs``; the first by default): its sections and its bundled presets."""
    task = get_task(task) if isinstance(task, str) else task
    overrides = dict(overrides)
    arch = check_arch(task, overrides.pop("arch", None))
    sources = [sections.PRESETS / f"{name}.toml" for name in task.presets(arch)]
    if preset:
        sources.append(sections.preset_file(preset, task.preset_prefix))
    parts = sections.build_sections(task.arch_sections(arch), sources, overrides)
    given = set(overrides)
    if preset and sections.PRESETS not in sources[-1].resolve().parents:  # the user's own file
        given |= set(preset_fields(preset, task, sections.field_owner(task.arch_sections(arch))))
    cfg = RunConfig(task.name, parts, arch, frozenset(given))
    check_finite(cfg)
    task.check(cfg)
    return cfg


def check_arch(task: Task, arch: str | None) -> str:
    """The architecture a new run of ``task`` trains: ``arch`` as the task records it, the
    task's default when None, or "" for a task of one architecture."""
    if not task.archs:
        if arch:
            raise UserError(f"--arch {arch}: {task.name} trains one architecture; drop --arch")
        return ""
    if arch is None:
        return task.archs[0]
    return task.known_arch(arch)


def check_finite(cfg: RunConfig) -> None:
    """Refuse inf and nan in any number of the config (``--lr inf`` trains nothing)."""
    for part in cfg.sections.values():
        for name, value in vars(part).items():
            if isinstance(value, float) and not math.isfinite(value):
                raise UserError(f"--{name.replace('_', '-')} {value}: give a finite number")


def saved_arch(task: Task, raw: Mapping[str, Any]) -> str:
    """The architecture a saved run of ``task`` records (its model section's ``arch``)."""
    if not task.archs:
        return ""
    model = raw.get("model")
    arch = model.get("arch") if isinstance(model, dict) else None
    try:
        return task.known_arch(arch) if isinstance(arch, str) else task.known_arch("")
    except UserError:
        raise UserError(
            f"the run's config.json names no architecture of {task.name} (model arch "
            f"{arch!r}, not one of {', '.join(task.archs)} or a folder that exists); restore "
            "the file or retrain"
        ) from None


def saved_config(task: Task, raw: Mapping[str, Any]) -> RunConfig:
    """The config a run directory was trained with (``raw`` = its config.json)."""
    arch = saved_arch(task, raw)
    parts = {**task.arch_sections(arch), **task.derived_sections(arch)}
    missing = [name for name in parts if name not in raw]
    if missing:
        raise UserError(f"the run's config.json lacks the section(s) {', '.join(missing)}")
    wrong = [name for name in parts if not isinstance(raw[name], dict)]
    if wrong:
        raise UserError(
            f"the run's config.json has {', '.join(repr(raw[n]) for n in wrong)} where the "
            f"section(s) {', '.join(wrong)} belong; restore the file or retrain"
        )
    values = {name: raw[name] for name in parts}
    if arch:
        values["model"] = {k: v for k, v in values["model"].items() if k != "arch"}
    parts = {name: from_dict(cls, values[name]) for name, cls in parts.items()}
    recorded = frozenset(name for part in parts.values() for name in vars(part))
    return RunConfig(task.name, parts, arch, recorded)  # what ran is kept as it ran


def resumed_config(
    task: Task,
    raw: Mapping[str, Any],
    overrides: Mapping[str, Any],
    preset: str | None,
    out: Path | None = None,
) -> RunConfig:
    """The saved config with the command line's safe changes; others are refused by name.

    A ``preset`` given again counts as its fields typed out: what it agrees on is no change.
    A data path may be given again when its file moved (the same content, see datafiles); a
    run that diverged may change its learning rate (``DIVERGED``)."""
    try:
        cfg = saved_config(task, raw)
    except ValueError as err:  # e.g. a setting this attnlab refuses, saved by an older one
        where = out / folder.CONFIG if out is not None else folder.CONFIG
        raise UserError(
            f"{where}: {err}; this run cannot be resumed: train a new run into another --out"
        ) from None
    owner = sections.field_owner(task.arch_sections(cfg.arch))
    if preset:
        overrides = {**preset_fields(preset, task, owner), **overrides}
    overrides = dict(overrides)
    arch = overrides.pop("arch", None)
    if arch is not None and arch != cfg.arch:
        raise UserError(
            f"--arch cannot change when resuming (the run trained {cfg.arch or 'one architecture'}"
            f"); start a new run to train {arch}"
        )
    moved = {k: str(overrides[k]) for k in task.data_paths if k in overrides and out is not None}
    overrides = {k: v for k, v in overrides.items() if k not in moved}
    allowed = RESUMABLE_FIELDS | task.resumable
    if out is not None and (out / DIVERGED).exists():
        allowed |= DIVERGED_FIELDS
    changes: dict[str, dict[str, Any]] = {}
    refused = []
    for key, value in overrides.items():
        if key not in owner:
            raise UserError(sections.unknown_field(key, owner, "the command line"))
        part = owner[key]
        new = apply_overrides(cfg.sections[part], {key: value})  # checked with the saved fields
        if getattr(new, key) == getattr(cfg.sections[part], key):
            continue
        if key not in allowed:
            refused.append(f"--{key.replace('_', '-')}")
        changes.setdefault(part, {})[key] = value
    if refused:
        raise UserError(
            f"{', '.join(refused)} cannot change when resuming (the run was trained with other "
            f"values); only {', '.join(sorted(allowed))} can. Start a new run to change the rest"
        )
    for part, values in changes.items():
        cfg.sections[part] = from_dict(
            type(cfg.sections[part]), {**to_dict(cfg.sections[part]), **values}
        )
    check_finite(cfg)
    task.check(cfg)
    if out is not None:
        datafiles.relocate(cfg, out)
        record = datafiles.accept_moved(cfg, out, moved, task.list_paths)
        datafiles.require(
            cfg,
            out,
            "pass {flag} NEW_PATH with --resume (the same file, checked by its "
            "sha256), or restore it",
        )
        cfg.data_record = record  # type: ignore[attr-defined]
    return cfg


def preset_fields(preset: str | Path, task: Task, owner: Mapping[str, str]) -> dict[str, Any]:
    """The fields a preset file sets, flat (sections or flat keys in the TOML)."""
    path = sections.preset_file(preset, task.preset_prefix)
    flat: dict[str, Any] = {}
    for key, value in load_toml(path).items():
        if isinstance(value, dict) and key not in owner:
            flat.update(value)
        else:
            flat[key] = value
    return flat


def say(msg: str) -> None:
    """A progress line on stderr (what `attnlab train` tells the user while it works)."""
    print(msg, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _take_folder(out: Path, resume: bool) -> Iterator[tuple[Path, folder.Staging | None]]:
    """(folder to prepare in, staging) for rank 0; other ranks get a private scratch folder."""
    if not folder.is_main_process():
        if resume:  # rank 0 only rewrites config.json: the data files can be read in place
            yield out, None
            return
        with tempfile.TemporaryDirectory(prefix="attnlab-rank-") as scratch:
            yield Path(scratch), None
        return
    if resume:
        with folder.RunLock(out):
            yield out, None
        return
    made = [d for d in (out.parent, *out.parent.parents) if not d.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with folder.Staging(out) as staging:
            try:
                yield staging.path, staging
            finally:
                staging.lock.release()
    except BaseException:
        for d in made:  # parents this start created, innermost first, if still empty
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def train(
    task_name: str,
    out: str | Path,
    overrides: Mapping[str, Any] | None = None,
    preset: str | Path | None = None,
    resume: bool = False,
    device: str = "cpu",
) -> dict[str, Any]:
    """Train ``task_name`` into ``out``; returns results (a summary alone on other ranks)."""
    from attnlab.train.checkpoint import check_checkpoint
    from attnlab.train.precision import check_precision

    task, out, overrides = get_task(task_name), Path(out), dict(overrides or {})
    main = folder.is_main_process()
    if main:
        folder.check_target(out, resume)
    record: dict[str, Any] = {}
    if resume:
        folder.check_resumable(out)
        raw = folder.read_config(out)
        if raw["task"] != task.name:
            raise UserError(
                f"--resume: {out} holds a {raw['task']!r} run, not {task.name!r}; "
                f"resume it with `attnlab train {raw['task']} --out {out} --resume`"
            )
        cfg = resumed_config(task, raw, overrides, preset, out)
        record = cfg.__dict__.pop("data_record", {})
        # a damaged checkpoint is refused before any file changes; a finished run with no
        # checkpoint (state/ deleted, a copy without it) would be trained over from step 0
        # (a run that failed before its first checkpoint has no summary: it starts over)
        ended = [n for n in ("summary.json", "results.json") if (out / n).is_file()]
        restoring = check_checkpoint(out) is not None
        done = finished(out, cfg)
        if done is not None:
            return done
        if not restoring and (out / folder.WEIGHTS).is_file() and ended:
            raise UserError(
                f"--resume: {out} holds a finished run ({folder.WEIGHTS}, {ended[0]}) but no "
                "checkpoint (state/) to continue from (a run keeps it with --keep-state true), "
                "and training from step 0 would overwrite its weights; train a new run into "
                "another --out"
            )
    else:
        cfg = build_config(task, preset, overrides)
        record = datafiles.resolve(cfg, task.data_paths, task.list_paths)
        restoring = False
    check_precision(cfg.train.precision, device)  # fp16 off CUDA: refused before the folder
    try:
        with _take_folder(out, resume) as (work, staging), _threads(cfg.train.num_threads):
            return _train(task, cfg, out, work, staging, record, resume, restoring, device)
    except KeyboardInterrupt:  # Ctrl-C: say what continues the work (main prints it, exit 130)
        raise KeyboardInterrupt(interrupted_note(task.name, out)) from None
    except FloatingPointError as err:  # the loss or gradients diverged
        if main:
            with contextlib.suppress(OSError):
                write_json(out / DIVERGED, {"error": str(err), "lr": cfg.train.lr})
        raise UserError(
            f"training diverged ({err}); the run in {out} keeps its last checkpoint: resume it "
            f"with a lower learning rate, `attnlab train {task.name} --out {out} --resume "
            f"--lr {cfg.train.lr / 10:g}`"
        ) from None
    except Exception as err:
        why = folder.write_failure(err)
        if why is None:
            raise
        raise UserError(_write_failure_message(task, out, why, resume)) from None


def interrupted_note(task_name: str, out: Path) -> str:
    """What continues a training that Ctrl-C stopped: a published run folder resumes; before
    the folder is published nothing was kept (its staging folder is gone), so the same command
    starts again (a --resume would find no run there)."""
    if (out / folder.CONFIG).is_file():
        return f"resume with `attnlab train {task_name} --out {out} --resume`"
    return f"nothing was kept in {out}: run the same command again to start over"


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """The whole run on ``n`` torch threads (0: torch's setting), the data's preparation and
    the recipe's frozen passes included, not the training loop alone; restored after."""
    import torch

    before = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _train(
    task: Task,
    cfg: RunConfig,
    out: Path,
    work: Path,
    staging: folder.Staging | None,
    record: Mapping[str, Any],
    resume: bool,
    restoring: bool,
    device: str,
) -> dict[str, Any]:
    """Prepare in ``work`` (the run folder, or a scratch one off rank 0), write the run's files,
    train and report (``train`` once the folder is taken). ``restoring``: a resume that has a
    checkpoint to continue from; a resume without one starts afresh, every step of the recipe
    included, and rewrites the run's files."""
    import torch

    from attnlab.train import Trainer, load_weights, seed_everything
    from attnlab.train.optim import layer_depths
    from attnlab.train.precision import autocast

    main = folder.is_main_process()
    setup = task.setup(cfg, work, restoring, device)
    seed_everything(cfg.train.seed)
    model = task.build_model(cfg, setup)
    if cfg.train.lr_decay < 1.0:
        layer_depths(model)  # refused here, before the folder is published
    if main:
        folder.write_config(work, cfg.to_json())
        datafiles.write_record(work, record)
        if not restoring:
            for name, write in setup.files.items():
                write(work / name)
        say(f"run directory: {out}")
        for line in setup.messages:
            say(line)
        if staging is not None:
            staging.publish()  # the lock stays held: its flock follows the folder
    trainer = Trainer(
        model, cfg.train, out, setup.train_data, task.step(cfg), setup.evaluate, device
    )
    summary = trainer.fit(resume=resume)
    if not main:
        return {"summary": summary}
    (out / DIVERGED).unlink(missing_ok=True)
    load_weights(model, out / folder.WEIGHTS)
    model.to(device).eval()
    with autocast(torch.device(device), trainer.dtype):  # the engine's evaluations' precision
        results = {"summary": summary, **task.finish(cfg, setup, model, out, device)}
    results["process"] = process_usage()
    write_json(out / "results.json", results)
    if not cfg.train.keep_state:  # what the run's verbs read stays; --resume past the end not
        from attnlab.train.checkpoint import STATE

        shutil.rmtree(out / STATE, ignore_errors=True)
    return results


def process_usage() -> dict[str, float]:
    """This process's peak resident memory (MiB) and CPU seconds so far (user + system): the
    process that finished the run, so after a ``--resume`` the resumed part only."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),  # Linux reports KiB
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
    }


def finished(out: Path, cfg: RunConfig) -> dict[str, Any] | None:
    """The saved results of a finished run that ``cfg`` does not take further, else None.

    A run that stopped at its step, epoch or time limit, or early, goes on when the resume
    raises that limit (``--max-steps 100`` on a run that stopped at 60 trains 40 more steps);
    otherwise nothing is done and no file changes."""
    from attnlab.train.checkpoint import read_trainer_state
    from attnlab.train.engine import can_continue
    from attnlab.train.meter import LoopState

    saved = read_trainer_state(out)
    if saved is not None:
        state = LoopState.from_dict(saved["loop"])
    else:  # state/ removed at the end: where the loop stopped is in summary.json
        summary = _summary(out)
        if summary is None:
            return None
        state = LoopState(
            step=summary["steps"], epoch=summary["epochs"], elapsed_s=summary["wall_time_s"],
            bad_evals=cfg.train.patience if summary["stop_reason"] == "early_stop" else 0,
            stop_reason=summary["stop_reason"],
        )  # fmt: skip
    if state.stop_reason is None or can_continue(state, cfg.train):
        return None
    results_path = out / "results.json"
    if not results_path.exists():
        return None  # finished training but not its results: let the runner write them
    say(
        f"the run in {out} already finished ({state.stop_reason} at step {state.step}); nothing "
        "to do and nothing changed (raise --max-steps, --epochs or --max-minutes to train on)"
    )
    return read_json(results_path, "results")


def _summary(out: Path) -> dict[str, Any] | None:
    """summary.json of a finished run (None when absent or not of that shape)."""
    path = out / "summary.json"
    if not path.is_file():
        return None
    keys = {"steps": int, "epochs": int, "wall_time_s": float, "stop_reason": str}
    return read_json(path, "run summary", keys=keys)


def _write_failure_message(task: Task, out: Path, why: str, resume: bool) -> str:
    """The one line for a run whose files could not be written (disk full, read-only, ...)."""
    from attnlab.train.checkpoint import STATE, recover_state_dir

    if not (out / folder.CONFIG).exists():  # a start: its staging folder is gone already
        return f"cannot write the new run {out} ({why}); nothing was kept: {FREE}"
    with contextlib.suppress(OSError):
        recover_state_dir(out)  # drop a half-written state.tmp/, keep the last whole checkpoint
    step = _checkpoint_step(out / STATE)
    kept = (
        "it has no checkpoint yet" if step is None else f"its last checkpoint (step {step}) is kept"
    )
    return (
        f"cannot write to the run {out} ({why}); {kept}: free space and continue with "
        f"`attnlab train {task.name} --out {out} --resume`"
    )


def _checkpoint_step(state: Path) -> int | None:
    try:
        return int(json.loads((state / "trainer.json").read_text())["loop"]["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def describe(task_name: str, results: Mapping[str, Any], run_dir: Path) -> list[str]:
    """What `attnlab train` prints after training: the task's lines and where results are."""
    s = results["summary"]
    best = (
        f"\nbest {s['monitor']} {s['best_metric']:.4f} at step {s['best_step']} of {s['steps']} "
        f"({s['stop_reason']}); {s['wall_time_s'] / 60:.1f} min, precision {s['precision']}"
    )
    if "process" in results:  # absent in runs from before it was recorded
        use = results["process"]
        best += f"; peak memory {use['peak_rss_mib'] / 1024:.2f} GiB, {use['cpu_s']:.0f} CPU-s"
    lines = get_task(task_name).describe(results, run_dir)
    return [best, *lines, f"results in {run_dir}/ (results.json, curves.png, metrics.jsonl)"]
