"""Classifier throughput on this CPU against its matmul peak and against the peers, in one run.

    python -m benchmarks.infer.throughput RUN [--threads 1,2] [--short 512] [--long 64]
        -> docs/results/throughput.{json,md}

1. The machine's matmul peak, measured with torch: float32 and bfloat16 ``torch.matmul`` of
   (1024 x 1024) @ (1024 x 1024), int8 ``torch._int_mm`` of the same shape (int32 sums), and
   at e5-small's feed-forward shape ((2048 x 384) @ (384 x 1536), 2,048 tokens) the Linear
   layers the paths run: fbgemm's int8 dynamic linear (``torch.ao`` quantized Linear, the
   int8 path), torch's float32 ``nn.Linear`` (MKL's sgemm), the same through oneDNN (the fp32
   path's ``OneDNNLinear``) and a bfloat16 ``nn.Linear`` (oneDNN, the bf16 path); GFLOP/s
   (GOP/s for int8) as 2·M·N·K over the best of 10 calls.
2. Texts/s for short reviews (the ``--short`` shortest-first bundled reviews under 64
   characters, spread over the corpus) and long ones (the ``--long`` longest bundled reviews,
   hundreds of pieces), through: attnlab's paths (``attnlab.load(RUN, precision=P,
   threads=T).predict``: fp32, int8, bf16 where the CPU has it, and fp32 and bf16 through
   ``torch.compile`` (``compile=True``) where a C++ compiler is here; and, to show what each
   costs, the fp32 model on torch's own Linear (MKL) rather than oneDNN's, and that bf16
   compiled pass without its float32 re-run of close calls); transformers'
   ``pipeline("text-classification")`` on ``attnlab export RUN --format hf`` (``batch_size``
   64, ``truncation=True``: its documented batching); onnxruntime on ``attnlab export RUN
   --format onnx`` (ORT_ENABLE_ALL, ``intra_op_num_threads`` = T, sequential) and on that graph
   after onnxruntime's documented int8 recipe (``quant_pre_process``, then ``quantize_dynamic``
   with int8 weights), fed the export's tokenizer.json through the tokenizers library in
   batches of 64. Every engine reads the same texts, sorted by length (attnlab sorts them
   itself; the others are given them sorted, so every one pads as little), tokenizing inside
   the timed span; each engine warms up on 16 texts, then the rounds interleave the engines and
   the best round counts; the page also gives the range of the round-by-round ratio of
   attnlab's fastest path that keeps the labels to onnxruntime's int8.
3. attnlab's labels on the run's own test split through each path, and onnxruntime's through
   both graphs, against attnlab fp32's: how many changed and the largest probability change
   (a peer's speed compares fairly only beside the labels it keeps).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    RESULTS,
    ROOT,
    command_line,
    load_average,
    machine,
    machine_line,
    write_page,
)

STEM = "throughput"
UNGUARDED = "bf16 compiled, close calls not re-run"
TORCH_LINEAR = "fp32, torch's Linear (MKL)"
BATCH = 64


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a trained e5 / BERT classifier run folder")
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    p.add_argument("--short", type=int, default=512, help="short reviews (default 512)")
    p.add_argument("--long", type=int, default=64, help="long reviews (default 64)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default 2)")
    p.add_argument("--out", default=STEM, help="results stem under docs/results/")
    return p


def peaks(threads: int) -> dict[str, float]:
    """GFLOP/s (GOP/s) of the best of 10 calls of each matmul on ``threads`` threads."""
    import warnings

    import torch

    torch.set_num_threads(threads)
    out = {}
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    cases = {
        "fp32 matmul 1024^3": (lambda: a @ b, 2 * n**3),
        "bf16 matmul 1024^3": (lambda: ab @ bb, 2 * n**3),
        "int8 _int_mm 1024^3 (int32 sums)": (lambda: torch._int_mm(ai, bi), 2 * n**3),
    }
    ab, bb = a.bfloat16(), b.bfloat16()
    ai = torch.randint(-128, 127, (n, n), dtype=torch.int8)
    bi = torch.randint(-128, 127, (n, n), dtype=torch.int8)
    lin = torch.nn.Linear(384, 1536)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qlin = torch.ao.quantization.quantize_dynamic(
            torch.nn.Sequential(lin), {torch.nn.Linear}, dtype=torch.qint8
        )
    x = torch.randn(2048, 384)
    cases["int8 dynamic Linear (fbgemm) 2048x384 @ 384x1536"] = (
        lambda: qlin(x),
        2 * 2048 * 384 * 1536,
    )
    cases["fp32 Linear (torch: MKL) 2048x384 @ 384x1536"] = (lambda: lin(x), 2 * 2048 * 384 * 1536)
    if torch.backends.mkldnn.is_available():  # what attnlab's fp32 path runs
        from attnlab.infer.precision import OneDNNLinear

        dnn = OneDNNLinear(lin)
        cases["fp32 Linear (oneDNN) 2048x384 @ 384x1536"] = (lambda: dnn(x), 2 * 2048 * 384 * 1536)
        xb, lb = x.bfloat16(), copy.deepcopy(lin).bfloat16()
        cases["bf16 Linear (oneDNN) 2048x384 @ 384x1536"] = (lambda: lb(xb), 2 * 2048 * 384 * 1536)
    with torch.no_grad():
        for name, (call, flops) in cases.items():
            call()
            best = float("inf")
            for _ in range(10):
                start = time.perf_counter()
                call()
                best = min(best, time.perf_counter() - start)
            out[name] = flops / best / 1e9
    return out


def texts_of(short: int, long: int) -> dict[str, list[str]]:
    """Short bundled reviews (under 64 characters, evenly spread over the corpus) and the
    longest ones."""
    from attnlab.data.sentiment import BUNDLED, read_corpus

    texts = read_corpus(BUNDLED).texts
    brief = [t for t in texts if len(t) < 64]
    step = max(len(brief) // short, 1)
    longest = sorted(texts, key=len, reverse=True)[:long]
    return {"short": sorted(brief[::step][:short], key=len), "long": sorted(longest, key=len)}


def export(run: str, fmt: str, target: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run([sys.executable, "-m", "attnlab", "export", run, "--format", fmt, "--out",
                    str(target)], check=True, capture_output=True, env=env)  # fmt: skip


def engines(run: str, folder: Path, onnx: Path, onnx8: Path, threads: int) -> dict:
    """{name: callable(texts) -> None}, every engine on ``threads`` threads."""
    import torch
    from transformers import pipeline

    import attnlab

    torch.set_num_threads(threads)
    out = {}
    for p, compiled in paths():
        clf = attnlab.load(run, threads=threads, precision=p, compile=compiled)
        out[f"attnlab {p}" + " compiled" * compiled] = clf.predict
        if p == "fp32" and not compiled:
            out[f"attnlab {TORCH_LINEAR}"] = torch_linear(clf).predict
        if p == "bf16" and compiled:
            out[f"attnlab {UNGUARDED}"] = unguarded(clf).predict
    remote = "auto_map" in json.loads((folder / "config.json").read_text())
    pipe = pipeline("text-classification", model=str(folder), trust_remote_code=remote,
                    device=-1, top_k=None)  # fmt: skip
    out["transformers pipeline fp32"] = lambda texts: pipe(texts, batch_size=BATCH,
                                                            truncation=True)  # fmt: skip
    for name, graph in (("onnxruntime fp32", onnx), ("onnxruntime int8", onnx8)):
        out[name] = ort_engine(run, folder, graph, threads)
    return out


def ort_engine(run: str, folder: Path, graph: Path, threads: int):
    """callable(texts) -> logits (N, C) of the ONNX ``graph`` on ``threads`` threads, in
    batches of ``BATCH``, tokenized by the export's tokenizer at the run's max_len."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    import attnlab

    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    raw.enable_padding(pad_id=raw.token_to_id("<pad>") or 0)
    raw.enable_truncation(attnlab.load(run).run.max_len)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])

    def run_ort(texts: list[str]) -> np.ndarray:
        logits = []
        for i in range(0, len(texts), BATCH):
            enc = raw.encode_batch(texts[i : i + BATCH])
            ids = np.array([e.ids for e in enc], dtype=np.int64)  # (B, T)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)  # (B, T)
            logits.append(session.run(None, {"input_ids": ids, "attention_mask": mask})[0])
        return np.concatenate(logits)  # (N, C)

    return run_ort


def handle(clf: Any, infer_model: Any) -> Any:
    """A second handle on ``clf`` (an attnlab.load classifier) whose predict runs
    ``infer_model``: a measurement only, not a path predict offers."""
    bare = copy.copy(clf)
    bare.run = copy.copy(clf.run)
    bare.run.infer_model = infer_model
    return bare


def unguarded(clf: Any) -> Any:
    """``clf`` (the bf16 compiled path) with its close calls not re-run in float32: the bf16
    pass alone, for the re-run's cost (it changes labels)."""
    return handle(clf, clf.run.infer_model.fast)  # the compiled bf16 pass, no Guarded


def torch_linear(clf: Any) -> Any:
    """``clf`` (the fp32 path) on the trained model as it is: torch's own float32 Linear (MKL's
    sgemm) rather than oneDNN's, what fp32 ran before."""
    return handle(clf, clf.run.model)


def paths() -> list[tuple[str, bool]]:
    """attnlab's paths on this machine, (precision, compiled): fp32, int8 and bf16 where the CPU
    has it, and fp32 / bf16 through torch.compile where a C++ compiler is here."""
    from attnlab.infer.precision import available, compile_missing

    eager = [(p, False) for p in available()]
    if compile_missing() is not None:
        return eager
    return eager + [(p, True) for p in available() if p != "int8"]


def label_check(
    run: str, folder: Path, graphs: dict[str, Path], sets: dict[str, list[str]]
) -> dict[str, dict]:
    """Each attnlab path, and onnxruntime on each graph of ``graphs`` ({name: ONNX file}), on
    the run's test split against attnlab fp32: labels changed, largest probability change; and
    the share of each of ``sets`` that bf16 compiled runs again in float32 (its close calls)."""
    import torch

    import attnlab

    ref_run = attnlab.load(run)
    texts, _, source = ref_run.run.split_texts("test")
    names = ref_run.run.labels.labels
    ref = torch.tensor([[r["probs"][k] for k in names] for r in ref_run.predict(texts)])  # (N, C)
    got: dict[str, torch.Tensor] = {}
    rerun: dict[str, dict] = {}
    for p, compiled in paths():
        clf = attnlab.load(run, precision=p, compile=compiled)
        handles = {p + " compiled" * compiled: clf}
        if p == "fp32" and not compiled:  # the reference itself: only torch's Linear to check
            handles = {TORCH_LINEAR: torch_linear(clf)}
        if p == "bf16" and compiled:
            handles[UNGUARDED] = unguarded(clf)
            guard = clf.run.infer_model  # attnlab.infer.precision.Guarded
            for kind, batch in sets.items():
                guard.seen = guard.rerun = 0
                clf.predict(batch)
                rerun[kind] = {"rerun": guard.rerun, "of": guard.seen}
        for name, handle in handles.items():
            got[name] = torch.tensor([[r["probs"][k] for k in names]
                                      for r in handle.predict(texts)])  # fmt: skip
    for name, graph in graphs.items():
        logits = torch.from_numpy(ort_engine(run, folder, graph, 1)(texts))  # (N, C)
        got[name] = logits.float().softmax(-1)
    out: dict[str, dict] = {"source": {"split": source, "n": len(texts)}, "rerun": rerun}
    for name, probs in got.items():
        out[name] = {"labels_changed": int((probs.argmax(-1) != ref.argmax(-1)).sum()),
                     "max_prob_change": float((probs - ref).abs().max())}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    counts = [int(t) for t in args.threads.split(",")]
    info = machine(threads=max(counts))
    from onnxruntime.quantization import QuantType, quant_pre_process, quantize_dynamic

    sets = texts_of(args.short, args.long)
    sizes = {k: len(v) for k, v in sets.items()}
    results: dict = {"command": command_line(argv), "machine": info, "run": args.run,
                     "texts": sizes, "peak": {}, "rates": {}, "rounds": {}}  # fmt: skip
    import attnlab

    reader = attnlab.load(args.run).run.reader
    results["pieces"] = {k: sum(reader.lengths(v)) / len(v) for k, v in sets.items()}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        export(args.run, "hf", root / "hf")
        export(args.run, "onnx", root / "m.onnx")
        quant_pre_process(str(root / "m.onnx"), str(root / "pre.onnx"))
        quantize_dynamic(str(root / "pre.onnx"), str(root / "m8.onnx"), weight_type=QuantType.QInt8)
        for n in counts:
            results["peak"][str(n)] = peaks(n)
            print(f"peak, {n} thread(s):", results["peak"][str(n)], flush=True)
            table = engines(args.run, root / "hf", root / "m.onnx", root / "m8.onnx", n)
            for kind, texts in sets.items():
                for call in table.values():
                    call(texts[:16])  # warm-up
                rounds: dict[str, list[float]] = {name: [] for name in table}
                for _ in range(args.rounds):
                    for name, call in table.items():
                        start = time.perf_counter()
                        call(texts)
                        rounds[name].append(len(texts) / (time.perf_counter() - start))
                        print(f"{n} thread(s), {kind}: {name} {rounds[name][-1]:.1f} texts/s",
                              flush=True)  # fmt: skip
                results["rates"].setdefault(str(n), {})[kind] = {k: max(v) for k, v in
                                                                 rounds.items()}  # fmt: skip
                results["rounds"].setdefault(str(n), {})[kind] = rounds
        results["labels"] = label_check(
            args.run,
            root / "hf",
            {"onnxruntime fp32": root / "m.onnx", "onnxruntime int8": root / "m8.onnx"},
            sets,
        )
    info["load_average_at_end"] = load_average()
    (RESULTS / f"{args.out}.json").write_text(json.dumps(results, indent=1) + "\n")
    write_page(RESULTS / f"{args.out}.md", render(results), results["command"])
    print(render(results))


def render(r: dict) -> str:
    lines = [
        "# Classifier throughput on the CPU: attnlab's paths, the matmul peak, the peers",
        "",
        machine_line(r["machine"]),
        "",
        f"Run: `{r['run']}`. Texts: {r['texts']['short']} short bundled reviews "
        f"({r['pieces']['short']:.1f} pieces on average) and the {r['texts']['long']} longest "
        f"({r['pieces']['long']:.0f} pieces on average, before the run's cut). Other work "
        "shared the two cores (the load average above), so the rates are lower bounds and "
        "only the ratios within one row of one run compare.",
        "",
        "## Matmul peak (torch)",
        "",
        "| matmul | " + " | ".join(f"{n} thread(s)" for n in r["peak"]) + " |",
        "|---|" + "---:|" * len(r["peak"]),
    ]
    names = list(next(iter(r["peak"].values())))
    lines += [f"| {k} | " + " | ".join(f"{r['peak'][n][k]:.0f} G/s" for n in r["peak"]) + " |"
              for k in names]  # fmt: skip
    lines += ["", "## Texts per second", ""]
    for n, kinds in r["rates"].items():
        engines = list(next(iter(kinds.values())))
        lines += [f"{n} thread(s):", "", "| engine | " + " | ".join(kinds) + " |",
                  "|---|" + "---:|" * len(kinds)]  # fmt: skip
        lines += [f"| {e} | " + " | ".join(f"{kinds[k][e]:.1f}" for k in kinds) + " |"
                  for e in engines]  # fmt: skip
        lines.append("")
        changed = {f"attnlab {p}": v["labels_changed"] for p, v in r["labels"].items()
                   if p not in ("source", "rerun")}  # fmt: skip
        for kind, rates in kinds.items():  # attnlab's fastest path that keeps fp32's labels
            kept = [e for e in rates if e == "attnlab fp32" or changed.get(e, 1) == 0]
            best = max(kept, key=lambda e: rates[e])
            fp32 = rates[best] / rates["attnlab fp32"]
            mkl = rates[best] / rates[f"attnlab {TORCH_LINEAR}"]
            ort8 = rates[best] / rates["onnxruntime int8"]
            paired = r["rounds"][n][kind]  # each round ran every engine once, one after another
            each = [a / b for a, b in zip(paired[best], paired["onnxruntime int8"])]
            lines.append(f"- {kind}: the fastest attnlab path that keeps the labels, {best}, "
                         f"runs {fp32:.2f}x attnlab fp32 ({mkl:.2f}x fp32 on torch's Linear) "
                         f"and {ort8:.2f}x onnxruntime int8 (round by round "
                         f"{min(each):.2f}-{max(each):.2f}x)")  # fmt: skip
            bare = f"attnlab {UNGUARDED}"
            if bare in rates:
                guarded = rates["attnlab bf16 compiled"]
                rerun = r["labels"]["rerun"][kind]
                lines.append(f"  - the float32 re-run of close calls ({rerun['rerun']} of these "
                             f"{rerun['of']} texts) costs bf16 compiled "
                             f"{1 - guarded / rates[bare]:.0%} of its rate: without it, "
                             f"{rates[bare] / rates['onnxruntime int8']:.2f}x onnxruntime int8, "
                             f"{changed[bare]} test labels changed")  # fmt: skip
        lines.append("")
    lab = r["labels"]
    lines += ["## Labels against fp32 on the run's test split", "",
              f"{lab['source']['split']}, n = {lab['source']['n']}.", "",
              "| path | labels changed | largest probability change |",
              "|---|---:|---:|"]  # fmt: skip
    lines += [f"| {p} | {v['labels_changed']} | {v['max_prob_change']:.4f} |"
              for p, v in lab.items() if p not in ("source", "rerun")]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
