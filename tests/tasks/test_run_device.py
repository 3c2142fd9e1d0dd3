"""Runs keep their device: every verb of every kind of run computes on the device
the run was loaded on and answers as on the CPU. Runs on ATTNLAB_TEST_DEVICE (cpu by default;
scripts/gpu_check.sh runs it on CUDA)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "explore"))
import explore_runs  # noqa: E402  (tiny run folders of every kind)

from attnlab.runs import load_run  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("device-runs")
    return {
        "classify": explore_runs.classifier_run(root),
        "lm": explore_runs.gpt_run(root),
        "translate": explore_runs.translate_run(root),
        "vit": explore_runs.vision_run(root, "vit"),
        "cnn": explore_runs.vision_run(root / "cnn", "cnn", channel_attention="cbam"),
        "image": explore_runs.image_file(root),
    }


def both(run_dir: Path, device: torch.device):
    """The run loaded on the CPU and on the device under test (model there, verbs there)."""
    cpu, there = load_run(run_dir, "cpu"), load_run(run_dir, str(device))
    assert there.device == device
    assert {p.device.type for p in there.model.parameters()} == {device.type}
    return cpu, there


def close(a: dict[str, float], b: dict[str, float]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=1e-4), key


def test_classifier_verbs_on_the_device(runs, device, tmp_path) -> None:
    cpu, there = both(runs["classify"], device)
    texts = explore_runs.TEXTS[:2]
    for a, b in zip(cpu.predict(texts), there.predict(texts)):
        assert a["label"] == b["label"]
        close(a["probs"], b["probs"])
    info = there.attention(texts[0])
    assert info["attention"].device.type == "cpu"
    torch.testing.assert_close(
        info["attention"], cpu.attention(texts[0])["attention"], atol=1e-5, rtol=0
    )
    data = tmp_path / "eval.csv"
    data.write_text("text,label\n" + "".join(f"{t},positive\n" for t in texts), encoding="utf-8")
    assert there.evaluate(data=str(data))["accuracy"] == cpu.evaluate(data=str(data))["accuracy"]
    assert any(
        "written to" in line for line in there.draw_attention(texts[0], str(tmp_path / "a.png"))
    )


def test_lm_translate_and_vision_verbs_on_the_device(runs, device, tmp_path) -> None:
    cpu, there = both(runs["lm"], device)
    kwargs = {"temperature": 0.0}
    want = cpu.generate("To be", 8, **kwargs).texts
    assert there.generate("To be", 8, **kwargs).texts == want
    cpu, there = both(runs["translate"], device)
    assert there.translate(["the cat"], 2) == cpu.translate(["the cat"], 2)
    for arch in ("vit", "cnn"):
        cpu, there = both(runs[arch], device)
        image = str(runs["image"])
        close(there.predict([image])[0]["probs"], cpu.predict([image])[0]["probs"])
    cpu, there = both(runs["vit"], device)
    lines = there.draw_attention(image, str(tmp_path / "r.png"))
    assert "rollout written to" in lines[-1]


def test_bert_classifier_verbs_on_the_device(device, tmp_path) -> None:
    cpu, there = both(explore_runs.bert_classifier_run(tmp_path), device)
    texts = ["a fine and moving film", "dull and far too long"]
    for a, b in zip(cpu.predict(texts), there.predict(texts)):
        assert a["label"] == b["label"]
        close(a["probs"], b["probs"])
    data = tmp_path / "eval.csv"
    data.write_text("text,label\n" + "".join(f"{t},positive\n" for t in texts), encoding="utf-8")
    assert there.evaluate(data=str(data))["loss"] == pytest.approx(
        cpu.evaluate(data=str(data))["loss"], abs=1e-4
    )
