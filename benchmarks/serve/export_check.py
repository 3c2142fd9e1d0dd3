"""What `attnlab export` writes for a run, and how close each loader comes to `predict`.

    python -m benchmarks.serve.export_check RUN [--out-dir DIR]
        -> docs/results/export_check.{json,md}

Exports RUN three ways (hf, hf --words float32, onnx) into a temporary folder, then reads a
set of texts (the tutorial's three sentences, one past max_len, one past XLM-R's 512 positions,
one holding the literal special tokens) through each loader: transformers' snippet
(AutoTokenizer + AutoModelForSequenceClassification, ``trust_remote_code`` for a mean-pooled
run, ``truncation=True``), ``pipeline`` (the same), and onnxruntime fed the folder's
tokenizer.json through the tokenizers library (no truncation: the graph cuts). The page gives
the sizes beside the run's weights, each export's time, and the largest difference of
P(label) from ``attnlab predict`` per loader.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, load_average, machine, machine_line, write_results

STEM = "export_check"
TEXTS = [
    "这部电影看得我热血沸腾，情节紧凑。",
    "剧情拖沓，演员演技一言难尽。",
    "电影前半段很无聊，但是结局让我感动",
    "好看的电影，" * 40,
    "一部电影，" * 400,
    "一般 <s> 好 </s> 看 <unk> 差",
]
EXPORTS = {"hf": ["--format", "hf"], "hf float32 words": ["--format", "hf", "--words", "float32"],
           "onnx": ["--format", "onnx"]}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a trained e5 / BERT classifier run folder")
    p.add_argument("--out-dir", default=None, help="where to export (default: a temporary one)")
    p.add_argument("--out", default=STEM, help="results stem under docs/results/")
    return p


def export(run: str, name: str, target: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "attnlab", "export", run, *EXPORTS[name], "--out",
                    str(target)], check=True, capture_output=True, env=env)  # fmt: skip
    return round(time.perf_counter() - start, 1)


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*")) if path.is_dir() else path.stat().st_size


def loader_gaps(folder: Path, onnx: Path, ours: list[dict]) -> dict[str, float]:
    """The largest |P(label) - predict's| of each loader over TEXTS."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    remote = "auto_map" in json.loads((folder / "config.json").read_text())
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=remote)
    tok = AutoTokenizer.from_pretrained(folder)
    pipe = pipeline("text-classification", model=str(folder), trust_remote_code=remote,
                    top_k=None)  # fmt: skip
    labels = list(ours[0]["probs"])
    gaps = {"snippet": 0.0, "pipeline": 0.0, "onnxruntime": 0.0}
    for text, pred in zip(TEXTS, ours):
        with torch.no_grad():
            logits = model(**tok(text, truncation=True, return_tensors="pt")).logits
        probs = torch.softmax(logits, -1)[0].tolist()
        gaps["snippet"] = max(gaps["snippet"], *(abs(probs[i] - pred["probs"][k])
                                                for i, k in enumerate(labels)))  # fmt: skip
        scores = {d["label"]: d["score"] for d in pipe([text], truncation=True)[0]}
        gaps["pipeline"] = max(gaps["pipeline"], *(abs(scores[k] - pred["probs"][k])
                                                  for k in labels))  # fmt: skip
    session = ort.InferenceSession(str(onnx))
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    raw.no_truncation()
    for text, pred in zip(TEXTS, ours):
        ids = np.array([raw.encode(text).ids], dtype=np.int64)
        (logits,) = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        probs = np.exp(logits[0]) / np.exp(logits[0]).sum()
        gaps["onnxruntime"] = max(gaps["onnxruntime"], *(abs(float(probs[i]) - pred["probs"][k])
                                                        for i, k in enumerate(labels)))  # fmt: skip
    return {k: float(f"{v:.2g}") for k, v in gaps.items()}


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    info = machine(threads=1)
    import attnlab

    ours = attnlab.load(args.run).predict(TEXTS)
    with tempfile.TemporaryDirectory(dir=args.out_dir) as tmp:
        root = Path(tmp)
        targets = {"hf": root / "hf", "hf float32 words": root / "hf32", "onnx": root / "m.onnx"}
        seconds = {name: export(args.run, name, target) for name, target in targets.items()}
        sizes = {name: size(target) for name, target in targets.items()}
        weights = {name: size(target / "model.safetensors") for name, target in targets.items()
                   if target.is_dir()}  # fmt: skip
        gaps = {
            "hf": loader_gaps(targets["hf"], targets["onnx"], ours),
            "hf float32 words": loader_gaps(targets["hf float32 words"], targets["onnx"], ours),
        }
    run_weights = (Path(args.run) / "model.safetensors").stat().st_size
    info["load_average_at_end"] = load_average()
    mb = 1e6
    lines = [
        "# attnlab export: sizes and how close each loader comes to predict",
        "",
        machine_line(info),
        "",
        f"Run: `{Path(args.run).resolve()}`, its model.safetensors {run_weights / mb:.0f} MB. "
        "Texts: the tutorial's three sentences, one past max_len, one past 512 pieces, one with "
        "the literal `<s> </s> <unk>`; the largest |P(label) - predict's| over them.",
        "",
        "| export | written MB | model.safetensors MB | seconds |",
        "|---|---:|---:|---:|",
        *(f"| {n} | {sizes[n] / mb:.0f} | {weights[n] / mb:.0f} | {seconds[n]} |"
          if n in weights else f"| {n} | {sizes[n] / mb:.0f} | (one file) | {seconds[n]} |"
          for n in EXPORTS),  # fmt: skip
        "",
        "| folder | snippet, truncation=True | pipeline, truncation=True | onnxruntime |",
        "|---|---:|---:|---:|",
        *(f"| {n} | {g['snippet']} | {g['pipeline']} | {g['onnxruntime']} |"
          for n, g in gaps.items()),  # fmt: skip
    ]
    data = {"machine": info, "run": str(Path(args.run).resolve()), "run_weights": run_weights,
            "sizes": sizes, "weights": weights, "seconds": seconds, "gaps": gaps}  # fmt: skip
    write_results(args.out, data, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
