"""The task layer: registry, run-directory format, the lock, resume, and bad input (one line on
stderr, exit 2, no files left, earlier runs untouched)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cli import TINY, probe, snapshot, write_corpus

from attnlab.cli import main
from attnlab.runs import folder, load_run
from attnlab.runs.registry import REGISTRY, get_task


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("data") / "reviews.csv")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, corpus) -> Path:
    """A finished tiny classifier run (shared, never modified by the tests)."""
    run = tmp_path_factory.mktemp("runs") / "done"
    args = ["train", "classify", "--out", str(run), "--data", str(corpus), *TINY]
    assert main([*args, "--max-steps", "6", "--eval-every", "3", "--checkpoint-every", "3"]) == 0
    return run


# ---------------------------------------------------------------------------- registry / format


def test_every_registered_task_loads_and_declares_its_sections() -> None:
    for name in REGISTRY:
        task = get_task(name)
        assert task.name == name
        assert "train" in task.sections()
    with pytest.raises(ValueError, match="known tasks"):
        get_task("nope")


def test_every_architecture_a_task_offers_is_a_registered_model() -> None:
    """`--arch NAME` is one way in every task with several architectures: each name is a model
    of `attnlab models`, and its model section is that entry's config (vision) or the task's."""
    from attnlab.models.registry import list_models, model_entry

    offered = {name: get_task(name).archs for name in REGISTRY}
    assert offered["vision"] == ("vit", "swin", "cnn", "deit")
    assert offered["mlm"] == ("bert", "albert", "deberta")
    assert offered["translate"] == ("seq2seq", "t5")
    # classify: the main job's encoder, every other pretrained encoder, the character model
    assert offered["classify"] == ("e5", "minilm", "char")
    for name, archs in offered.items():
        assert set(archs) <= set(list_models()), (name, archs)
        task = get_task(name)
        for arch in archs:
            assert "model" in {**task.arch_sections(arch), **task.derived_sections(arch)}
    for arch in offered["vision"]:
        assert get_task("vision").arch_sections(arch)["model"] is model_entry(arch).config


@pytest.mark.parametrize(
    ("task", "arch", "needle"),
    [
        ("vision", "vitt", "unknown --arch 'vitt' for vision; one of vit, swin, cnn, deit"),
        ("mlm", "roberta", "unknown --arch 'roberta': a new bert, albert, deberta"),
        ("translate", "transformer", "unknown --arch 'transformer' for translate; one of"),
        ("lm", "mamba", "--arch mamba: lm trains one architecture; drop --arch"),
        ("classify", "gpt", "unknown --arch 'gpt': give e5, minilm, char, a BERT / XLM-R"),
    ],
)
def test_an_unknown_arch_is_one_line_and_no_folder(task, arch, needle, tmp_path, capsys) -> None:
    out = tmp_path / "runs" / "x"
    probe(capsys, ["train", task, "--arch", arch, "--out", str(out)], needle)
    probe(capsys, ["train", task, "--arch", arch, "--help"], needle)
    assert not (tmp_path / "runs").exists()
    probe(capsys, ["train", task, f"arch={arch}", "--out", str(out)], "--arch NAME")
    assert not (tmp_path / "runs").exists()


def test_help_lists_the_options_of_the_chosen_arch(capsys) -> None:
    helps = {}
    for arch in ("vit", "swin", "cnn"):
        with pytest.raises(SystemExit):
            main(["train", "vision", "--arch", arch, "--help"])
        helps[arch] = " ".join(capsys.readouterr().out.split())
    assert "--mlp-ratio" in helps["swin"] and "--mlp-ratio" not in helps["vit"]
    assert "--channel-attention" in helps["cnn"] and "--d-model" not in helps["cnn"]
    assert "--arch ARCH" in helps["vit"] and "vit | swin | cnn | deit" in helps["vit"]
    shown = dict(re.findall(r"--(\w+) \S+ .*?\(default: ([^)]*)\)", helps["swin"]))
    assert shown["mlp_ratio"] == "2.0"  # presets/vision_swin.toml's, not the dataclass's


def test_config_json_has_one_layout_with_task_and_format(finished) -> None:
    raw = json.loads((finished / "config.json").read_text())
    assert raw["format"] == 2 and raw["task"] == "classify"
    assert {"data", "model", "train"} <= set(raw)
    run = load_run(finished)
    assert run.verbs == ("predict", "evaluate", "attention")
    with pytest.raises(ValueError, match="cannot generate"):
        run.require("generate")


def test_a_config_json_of_another_format_is_refused_with_the_fix(
    tmp_path: Path, capsys, finished
) -> None:
    run = tmp_path / "other"
    shutil.copytree(finished, run)
    raw = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**raw, "format": 99}))
    probe(capsys, ["predict", str(run), "好"], "format 99", "upgrade attnlab")
    old = {k: v for k, v in raw.items() if k != "format"}  # the layout before the registry
    (run / "config.json").write_text(json.dumps(old))
    probe(capsys, ["predict", str(run), "好"], "format 1, older", "train the run again")
    (run / "config.json").write_text("{broken")
    probe(capsys, ["predict", str(run), "好"], str(run / "config.json"), "not valid JSON")


# ---------------------------------------------------------------------------- resume


def test_resume_uses_the_saved_config_and_refuses_contradictions(
    tmp_path, corpus, capsys, monkeypatch
):
    from attnlab.tasks.classify import ClassifyTask

    run = tmp_path / "r"
    base = ["train", "classify", "--out", str(run), "--data", str(corpus), *TINY]
    real = ClassifyTask.step

    def interrupted(self, cfg):
        step, calls = real(self, cfg), {"n": 0}

        def wrapped(model, batch):
            calls["n"] += 1
            if calls["n"] == 4:
                raise KeyboardInterrupt
            return step(model, batch)

        return wrapped

    monkeypatch.setattr(ClassifyTask, "step", interrupted)
    assert main([*base, "--max-steps", "5", "--eval-every", "2", "--checkpoint-every", "2"]) == 130
    monkeypatch.setattr(ClassifyTask, "step", real)
    # --resume alone rebuilds the saved model (d_model 16, not the preset's) and may go longer
    assert main(["train", "classify", "--out", str(run), "--resume", "--max-steps", "6"]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["max_steps"] == 6 and config["model"]["d_model"] == 16
    assert json.loads((run / "summary.json").read_text())["steps"] == 6
    before = snapshot(run)
    resume = ["train", "classify", "--out", str(run), "--resume"]
    probe(capsys, [*resume, "--d-model", "32", "--lr", "1"], "--d-model", "--lr", "resuming")
    probe(capsys, ["train", "lm", "--out", str(run), "--resume"], "'classify' run")
    probe(capsys, [*base, "--max-steps", "3"], "already holds a run", "--resume")
    assert snapshot(run) == before  # refused commands changed nothing


def test_resume_of_nothing_and_out_as_a_file(tmp_path, corpus, capsys) -> None:
    probe(capsys, ["train", "classify", "--out", str(tmp_path / "none"), "--resume"], "no run")
    afile = tmp_path / "afile"
    afile.write_text("x")
    probe(capsys, ["train", "classify", "--out", str(afile), "--data", str(corpus)], "is a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


# ---------------------------------------------------------------------------- validation first


@pytest.mark.parametrize(
    "bad, needle",
    [
        (["--d-model", "100", "--n-heads", "3"], "divisible"),
        (["--n-heads", "0"], "n_heads"),
        (["--lr", "abc"], "lr"),
    ],
)
def test_invalid_options_leave_no_files(tmp_path, corpus, capsys, bad, needle) -> None:
    out = tmp_path / "deep" / "run"
    argv = ["train", "classify", "--out", str(out), "--data", str(corpus), *TINY, *bad]
    probe(capsys, argv, needle)
    assert list(tmp_path.iterdir()) == []  # not even the parent folder or a staging folder


# ---------------------------------------------------------------------------- the lock


def test_the_lock_refuses_a_second_writer_and_names_the_holder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom attnlab.runs.folder import RunLock\n"
         "lock = RunLock(__import__('pathlib').Path(sys.argv[1])).acquire()\n"
         "print('held', flush=True)\ntime.sleep(60)", str(run)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=f"pid {holder.pid} on .* since"):
            folder.RunLock(run).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    folder.RunLock(run).acquire().release()  # a killed holder leaves no stale lock


def test_two_trainings_into_one_out_cannot_mix(tmp_path, corpus, capsys) -> None:
    """Two `train` into one --out at once: one runs; the other is refused
    at once (whichever way the race goes) and the winner's run stays consistent."""
    out = tmp_path / "R"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    common = [*TINY, "--data", str(corpus), "--max-steps", "400", "--checkpoint-every", "5"]
    first = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "train", "classify", "--out", str(out), *common],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 60
        while not (out / "config.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        assert (out / "config.json").exists(), first.stderr.read() if first.poll() else "slow"
        probe(capsys, ["train", "classify", "--out", str(out), *common], "already holds")
        probe(capsys, ["train", "classify", "--out", str(out), "--resume"], "in use", "pid")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert not list(tmp_path.glob(".R.starting-*"))


def test_a_start_that_loses_the_race_discards_only_its_own_files(tmp_path: Path) -> None:
    out = tmp_path / "R"
    staging = folder.Staging(out).__enter__()
    (staging.path / "config.json").write_text("{}")
    out.mkdir()
    (out / "config.json").write_text('{"task": "other"}')  # another start published first
    with pytest.raises(ValueError, match="was taken by another run"):
        staging.publish()
    staging.discard()
    assert (out / "config.json").read_text() == '{"task": "other"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["R"]


# ---------------------------------------------------------------------------- loading and help


def test_missing_run_files_give_one_line(tmp_path, finished, capsys) -> None:
    run = tmp_path / "copy"
    shutil.copytree(finished, run)
    (run / "data_report.json").unlink()
    probe(capsys, ["predict", str(run), "好"], "data_report.json")
    (run / "model.safetensors").unlink()
    probe(capsys, ["predict", str(run), "好"], "no model.safetensors", "--resume")
    probe(capsys, ["predict", str(tmp_path / "nowhere"), "好"], "does not exist")


def _cases() -> list[tuple[str, str | None]]:
    return [(name, arch) for name in REGISTRY for arch in (get_task(name).archs or (None,))]


@pytest.mark.parametrize(("name", "arch"), _cases())
def test_help_shows_the_values_the_run_resolves(name: str, arch: str | None) -> None:
    """For every task and --arch, each option's default on the help page is the value a run
    given no other option trains with (the bundled presets, not the dataclasses)."""
    from attnlab.cli import task_parser
    from attnlab.runs.training import build_config

    argv = [] if arch is None else ["--arch", arch]
    parser = task_parser(name, argv)
    cfg = build_config(get_task(name), None, {} if arch is None else {"arch": arch})
    values = {k: v for part in cfg.sections.values() for k, v in vars(part).items()}
    shown = {
        a.dest: re.search(r"\(default: (.*)\)$", a.help.replace("%%", "%"), re.S).group(1)
        for a in parser._actions
        if a.dest in values
    }
    assert shown and shown == {k: str(values[k]) for k in shown}, (name, arch)


def test_help_shows_the_main_jobs_values(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["train", "classify", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    shown = dict(re.findall(r"--([\w-]+) \S+ .*?\(default: ([^)]*)\)", text))
    assert shown["lr"] == "5e-05" and shown["epochs"] == "1" and shown["probe-first"] == "True"
    assert shown["extra-train"] == "pang_lee" and shown["turns"] == "2000" and "--arch ARCH" in text
    with pytest.raises(SystemExit):
        main(["train", "lm", "--config", "baby", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    shown = dict(re.findall(r"--(\w+) \S+ .*?\(default: ([^)]*)\)", text))
    assert shown["bias"] == "False"  # the baby preset's, not the dataclass's True


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"]])
def test_top_level_help_does_not_import_torch(argv: list[str]) -> None:
    code = (
        f"import sys\nfrom attnlab.cli import main\ntry:\n    main({argv!r})\n"
        "except SystemExit:\n    pass\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False"), out.stdout[-300:]


def test_weights_are_checked_on_load(tmp_path, finished, capsys) -> None:
    run = tmp_path / "copy"
    shutil.copytree(finished, run)
    path = run / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-64:] = bytes(64)  # overwrite tensor bytes, same size
    path.write_bytes(bytes(data))
    probe(capsys, ["predict", str(run), "好"], "model.safetensors")
    path.write_bytes(bytes(data[: len(data) // 2]))
    probe(capsys, ["predict", str(run), "好"], "model.safetensors")


def test_one_class_and_junk_labels_are_refused_before_any_file(tmp_path, corpus, capsys):
    one = tmp_path / "one.csv"
    one.write_text("text,label\n" + "".join(f"好{i},positive\n" for i in range(40)))
    out = tmp_path / "runs" / "x"
    probe(capsys, ["train", "classify", "--data", str(one), "--out", str(out)], "two classes")
    junk = tmp_path / "junk.csv"
    junk.write_text(corpus.read_text() + "坏,?\n差,N/A\n")
    argv = ["train", "classify", "--data", str(junk), "--out", str(out), *TINY]
    probe(capsys, argv, "'?'", "'N/A'", "--allow-rare-labels")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.csv", "one.csv"]
    capsys.readouterr()
    ok = [*argv, "--allow-rare-labels", "--max-steps", "2", "--eval-every", "2"]
    ok += ["--test-ratio", "0"]
    assert main(ok) == 0


def test_a_truncated_checkpoint_on_resume_gives_one_line(tmp_path, finished, capsys) -> None:
    run = tmp_path / "copy"
    shutil.copytree(finished, run)
    before = snapshot(run)
    state = run / "state" / "optimizer.safetensors"
    state.write_bytes(state.read_bytes()[:100])
    before["state/optimizer.safetensors"] = hashlib.sha256(state.read_bytes()).hexdigest()
    argv = ["train", "classify", "--out", str(run), "--resume", "--max-steps", "9"]
    probe(capsys, argv, "optimizer.safetensors", "truncated")
    assert snapshot(run) == before  # the refused resume rewrote nothing


def test_results_record_the_finishing_process_memory_and_cpu(finished) -> None:
    import resource

    use = json.loads((finished / "results.json").read_text())["process"]
    own = resource.getrusage(resource.RUSAGE_SELF)  # the test process trained it, in-process
    assert 100 < use["peak_rss_mib"] <= own.ru_maxrss / 1024 + 0.1
    assert 0 < use["cpu_s"] <= own.ru_utime + own.ru_stime + 0.1


# ---------------------------------------------------------------------------- stops and limits


def test_resume_with_a_higher_max_steps_trains_on_and_a_lower_one_changes_nothing(
    tmp_path, finished, capsys
) -> None:
    run = tmp_path / "copy"
    shutil.copytree(finished, run)  # finished at step 6
    resume = ["train", "classify", "--out", str(run), "--resume", "--max-steps"]
    before = snapshot(run)
    capsys.readouterr()
    assert main([*resume, "5"]) == 0  # below where it stopped: nothing to do
    assert "nothing changed" in capsys.readouterr().err
    assert snapshot(run) == before
    assert main([*resume, "9"]) == 0  # 3 more steps, and every file agrees
    config = json.loads((run / "config.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    results = json.loads((run / "results.json").read_text())
    assert config["train"]["max_steps"] == 9 and summary["steps"] == 9
    assert results["summary"]["steps"] == 9
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 9 and steps == sorted(steps)


@pytest.mark.parametrize("value", ["inf", "nan", "1e999"])
def test_non_finite_numbers_are_refused_before_any_file(tmp_path, corpus, capsys, value) -> None:
    out = tmp_path / "run"
    probe(capsys, ["train", "classify", "--out", str(out), "--data", str(corpus), *TINY,
                   "--lr", value], "lr")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_a_diverging_run_is_one_line_and_resumes_with_a_sane_lr(tmp_path, corpus, capsys):
    out = tmp_path / "run"
    argv = ["train", "classify", "--out", str(out), "--data", str(corpus), *TINY]
    capsys.readouterr()
    code = main([*argv, "--lr", "1e30", "--clip-norm", "0", "--max-steps", "6",
                 "--eval-every", "6", "--dropout", "0"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "Traceback" not in "\n".join(err), err
    assert err[-1].startswith("attnlab: error: training diverged") and "--lr" in err[-1]
    resume = ["train", "classify", "--out", str(out), "--resume"]
    probe(capsys, [*resume, "--d-model", "32"], "--d-model")  # only the lr may change
    assert main([*resume, "--lr", "1e-3"]) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 6
    assert not (out / "diverged.json").exists()


def test_sigterm_writes_the_checkpoint_like_sigint(tmp_path, corpus) -> None:
    out = tmp_path / "run"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "attnlab", "train", "classify", "--out", str(out),
            "--data", str(corpus), *TINY, "--max-steps", "100000", "--eval-every", "100000",
            "--checkpoint-every", "100000"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.time() + 60
    while not (out / "metrics.jsonl").exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted; checkpoint of step" in err and "Traceback" not in err
    step = json.loads((out / "state" / "trainer.json").read_text())["loop"]["step"]
    assert step > 0


def test_a_finished_run_keeps_what_its_verbs_read(tmp_path, corpus, capsys) -> None:
    """By default the last checkpoint (state/: weights, optimizer moments, RNG) goes once the
    run ends; the same command again is done already, a higher limit needs --keep-state."""
    run = tmp_path / "r"
    argv = ["train", "classify", "--out", str(run), "--data", str(corpus), *TINY]
    assert main([*argv, "--keep-state", "false", "--max-steps", "2"]) == 0
    assert not (run / "state").exists() and (run / "model.safetensors").is_file()
    assert main(["predict", str(run), "好"]) == 0 and main(["eval", str(run)]) == 0
    before = snapshot(run)
    assert main(["train", "classify", "--out", str(run), "--resume"]) == 0
    assert "already finished" in capsys.readouterr().err and snapshot(run) == before
    resume = ["train", "classify", "--out", str(run), "--resume", "--max-steps", "3"]
    probe(capsys, resume, "no checkpoint (state/)", "--keep-state true")
    assert snapshot(run) == before
    kept = tmp_path / "kept"
    argv[3] = str(kept)
    assert main([*argv, "--keep-state", "true", "--max-steps", "2"]) == 0
    assert (kept / "state").is_dir()
    assert main(["train", "classify", "--out", str(kept), "--resume", "--max-steps", "3"]) == 0


def test_num_threads_holds_for_the_whole_run(tmp_path, corpus, monkeypatch) -> None:
    """--num-threads applies from the data's preparation on (the recipe's frozen passes run in
    build_model, before the training loop), and torch's setting comes back afterwards."""
    import torch

    from attnlab.tasks.classify import ClassifyTask

    seen = []
    real = ClassifyTask.build_model

    def build_model(self, cfg, setup):
        seen.append(torch.get_num_threads())
        return real(self, cfg, setup)

    monkeypatch.setattr(ClassifyTask, "build_model", build_model)
    torch.set_num_threads(2)
    argv = ["train", "classify", "--out", str(tmp_path / "r"), "--data", str(corpus), *TINY]
    assert main([*argv, "--max-steps", "1"]) == 0  # TINY: --num-threads 1
    assert seen == [1] and torch.get_num_threads() == 2


def test_lr_decay_on_a_model_without_depths_is_refused_before_any_file(tmp_path, corpus, capsys):
    out = tmp_path / "run"  # the character model lists no layer depths: nothing to decay by
    probe(capsys, ["train", "classify", "--out", str(out), "--data", str(corpus), *TINY,
                   "--lr-decay", "0.9"], "layer_depths")  # fmt: skip
    assert list(tmp_path.iterdir()) == []
