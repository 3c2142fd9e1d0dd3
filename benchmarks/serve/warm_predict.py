"""Where a warm `predict` call's time goes: three sentences through a loaded classifier run.

    python -m benchmarks.serve.warm_predict RUN [--rounds 9]
        -> docs/results/predict_warm.{json,md}

One process loads RUN once, then each round times, one after another (so the machine's load
falls on every case alike): the run's own ``predict`` on torch's default thread count and on
one thread; ``attnlab.load(RUN).predict`` (one thread, the API's default); and the parts of a
call on each thread count: the tokenizer, the forward pass under ``no_grad`` and with autograd
recording, the share-of-<unk> computation. Also a 64-text batch's forward pass on each thread
count, the case where more threads could pay. Medians over the rounds; float32 throughout.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import load_average, machine, machine_line, write_results

STEM = "predict_warm"
SENTENCES = [
    "这部电影看得我热血沸腾，情节紧凑。",
    "剧情拖沓，演员演技一言难尽。",
    "电影前半段很无聊，但是结局让我感动",
]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a trained classifier run folder")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--out", default=STEM, help="results stem under docs/results/")
    return p


def cases(run_dir: str) -> tuple[dict[str, Callable[[], object]], dict]:
    """name -> a call to time (the thread count set inside), and what the run is."""
    import torch

    import attnlab
    from attnlab.api import torch_threads
    from attnlab.data import pad_batch
    from attnlab.data.coverage import reach

    default_threads = torch.get_num_threads()
    clf = attnlab.load(run_dir)
    run = clf.run
    tok = run.tokenizer
    seqs = tok.encode_batch(SENTENCES, run.max_len)
    ids, lengths = pad_batch(seqs, tok.pad_id)
    many = SENTENCES * 22  # 66 texts: a batch
    big_ids, big_lengths = pad_batch(tok.encode_batch(many[:64], run.max_len), tok.pad_id)

    def on(threads: int, fn: Callable[[], object]) -> Callable[[], object]:
        def call() -> object:
            with torch_threads(threads):
                return fn()

        return call

    def forward(x, n, grad: bool) -> Callable[[], object]:
        def call() -> object:
            with torch.set_grad_enabled(grad):
                return run.model(x, n)

        return call

    out: dict[str, Callable[[], object]] = {
        f"run.predict, {default_threads} threads (torch's default)": on(
            default_threads, lambda: run.predict(SENTENCES)
        ),
        "run.predict, 1 thread": on(1, lambda: run.predict(SENTENCES)),
        "attnlab.load(RUN).predict (1 thread)": lambda: clf.predict(SENTENCES),
    }
    for threads in (default_threads, 1):
        out |= {
            f"tokenizer, {threads} thread(s)": on(
                threads, lambda: tok.encode_batch(SENTENCES, run.max_len)
            ),
            f"forward no_grad, {threads} thread(s)": on(threads, forward(ids, lengths, False)),
            f"forward with autograd, {threads} thread(s)": on(threads, forward(ids, lengths, True)),
            f"share of <unk>, {threads} thread(s)": on(
                threads, lambda: [reach(s, tok.unk_id, {tok.cls_id, tok.sep_id}) for s in seqs]
            ),
            f"forward no_grad of 64 texts, {threads} thread(s)": on(
                threads, forward(big_ids, big_lengths, False)
            ),
        }
    about = {
        "run": str(Path(run_dir).resolve()),
        "task": run.task,
        "arch": run.config.arch,
        "max_len": run.max_len,
        "tokens_per_call": int(lengths.sum()),
        "padded_shape": list(ids.shape),
        "batch_of_64_shape": list(big_ids.shape),
        "default_threads": default_threads,
        "precision": "float32",
    }
    return out, about


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    info = machine()
    calls, about = cases(args.run)
    for fn in calls.values():  # warm every path once
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    info["load_average_at_end"] = load_average()
    rows = [
        {
            "case": name,
            "median_ms": round(statistics.median(t) * 1000, 2),
            "min_ms": round(min(t) * 1000, 2),
            "max_ms": round(max(t) * 1000, 2),
        }
        for name, t in times.items()
    ]
    lines = [
        "# A warm predict call: where the time goes",
        "",
        machine_line(info),
        "",
        f"Run: `{about['run']}` ({about['task']} --arch {about['arch']}, max_len "
        f"{about['max_len']}); three sentences, "
        f"{about['tokens_per_call']} pieces padded to {about['padded_shape']}; float32; "
        f"{args.rounds} rounds, every case once a round in the order below; the 64-text "
        f"batch is {about['batch_of_64_shape']}.",
        "",
        "| case | median ms | min ms | max ms |",
        "|---|---:|---:|---:|",
        *(f"| {r['case']} | {r['median_ms']} | {r['min_ms']} | {r['max_ms']} |" for r in rows),
    ]
    write_results(args.out, {"machine": info, "run": about, "rows": rows}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
