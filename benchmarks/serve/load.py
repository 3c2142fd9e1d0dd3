"""`attnlab serve` under 1, 8, 32 and 128 concurrent loopback clients, beside the cold CLI.

    python -m benchmarks.serve.load RUN [--total 256] [--threads 1] [--precision fp32]
        [--cli-rounds 3] -> docs/results/serve_load.{json,md}

Starts ``attnlab serve RUN --port 0 --threads T --precision P`` in a child process (batches of
up to 64 texts; its start-up lines, which say the inference path it took, go on the page). For
each concurrency level, that many client threads share ``--total`` requests (each sends its
share one after another: a bounded loop), every request the tutorial's three sentences on a
new connection; the page gives each level's request latency (p50, p95, p99, max, from sending
to the parsed answer), its throughput (texts answered per second of the level's wall time),
the requests that failed (any status but 200, or no answer) and the forward passes the server
ran for them (from GET /health: fewer than requests means requests shared a pass). Beside it,
the cold CLI: ``attnlab predict RUN`` of the same three sentences in a fresh process, median of
``--cli-rounds``. The clients run in this process (Python threads, mostly waiting on sockets)
on the same cores as the server; loopback only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import ROOT, load_average, machine, machine_line, write_results

STEM = "serve_load"
SENTENCES = [
    "这部电影看得我热血沸腾，情节紧凑。",
    "剧情拖沓，演员演技一言难尽。",
    "电影前半段很无聊，但是结局让我感动",
]
LEVELS = (1, 8, 32, 128)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a trained classifier run folder")
    p.add_argument("--total", type=int, default=256, help="requests per level, shared by its "
                   "clients (each sends at least one)")  # fmt: skip
    p.add_argument("--threads", default="1", help="the server's --threads (a number or auto)")
    p.add_argument("--precision", default="fp32", help="the server's --precision")
    p.add_argument("--cli-rounds", type=int, default=3)
    p.add_argument("--note", default="", help="a sentence for the page about the run measured")
    p.add_argument("--out", default=STEM, help="results stem under docs/results/")
    return p


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def start_server(run: str, threads: str, precision: str, log) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "attnlab", "serve", run, "--port", "0", "--threads", threads,
           "--precision", precision]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env())
    found = re.search(r"http://127\.0\.0\.1:(\d+)/", proc.stdout.readline())
    if not found:
        proc.kill()
        raise SystemExit("the server did not start")
    return proc, int(found.group(1))


def rank(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of ``ordered`` (nearest rank: a latency some request had)."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def call(port: int, method: str, path: str, body: bytes | None = None) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, path, body, headers)
    answer = conn.getresponse()
    data = json.loads(answer.read())
    conn.close()
    if answer.status != 200:
        raise SystemExit(f"{path}: {answer.status} {data}")
    return data


def level(port: int, clients: int, total: int) -> dict:
    """``clients`` threads sharing ``total`` requests, each its share in a row: latencies
    and throughput."""
    requests = max(1, math.ceil(total / clients))
    body = json.dumps({"texts": SENTENCES}, ensure_ascii=False).encode()
    latencies: list[float] = []
    lock = threading.Lock()
    go = threading.Barrier(clients + 1)

    failures: list[str] = []

    def client() -> None:
        go.wait()
        for _ in range(requests):
            start = time.perf_counter()
            try:
                call(port, "POST", "/predict", body)
            except (OSError, http.client.HTTPException, SystemExit) as err:
                with lock:
                    failures.append(repr(err))
                continue
            with lock:
                latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    before = call(port, "GET", "/health")["batches"]
    go.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    passes = call(port, "GET", "/health")["batches"] - before
    latencies.sort()
    n = len(latencies)
    return {
        "clients": clients,
        "requests_each": requests,
        "requests": n,
        "failed": len(failures),
        "failures": sorted(set(failures))[:5],
        "forward_passes": passes,
        "p50_ms": round(rank(latencies, 0.50) * 1000, 1),
        "p95_ms": round(rank(latencies, 0.95) * 1000, 1),
        "p99_ms": round(rank(latencies, 0.99) * 1000, 1),
        "max_ms": round(latencies[-1] * 1000, 1),
        "texts_per_s": round(n * len(SENTENCES) / wall, 1),
        "wall_s": round(wall, 2),
    }


def cold_cli(run: str, rounds: int, threads: str, precision: str) -> list[float]:
    cmd = [sys.executable, "-m", "attnlab", "predict", run, "--threads", threads,
           "--precision", precision, *SENTENCES]  # fmt: skip
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env())
        times.append(round(time.perf_counter() - start, 2))
    return times


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.total < 1:
        raise SystemExit("--total must be >= 1")
    info = machine(threads=None if args.threads == "auto" else int(args.threads))
    with tempfile.TemporaryFile("w+", encoding="utf-8") as log:
        proc, port = start_server(args.run, args.threads, args.precision, log)
        try:
            body = json.dumps({"texts": SENTENCES}, ensure_ascii=False).encode()
            for _ in range(3):  # warm the server's paths
                call(port, "POST", "/predict", body)
            rows = []
            for clients in LEVELS:
                rows.append(level(port, clients, args.total))
                print(f"{clients} clients: {rows[-1]}", file=sys.stderr, flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
        log.seek(0)
        said = [line.strip() for line in log if line.startswith("serve: ") and
                "stop" not in line and "answers in" not in line]  # fmt: skip
    cli = cold_cli(args.run, args.cli_rounds, args.threads, args.precision)
    info["load_average_at_end"] = load_average()
    run = Path(args.run).resolve()
    one = next(r for r in rows if r["clients"] == 1)
    best = max(rows, key=lambda r: r["texts_per_s"])
    lines = [
        "# attnlab serve under concurrent loopback clients, beside the cold CLI",
        "",
        machine_line(info),
        "",
        f"Run: `{run.name}`; the server `attnlab serve RUN --threads {args.threads} --precision "
        f"{args.precision}` (batches of up to 64 texts), which said at start: "
        + ("; ".join(f"`{line}`" for line in said) or "nothing more")
        + ". Each request is the tutorial's three sentences on a new connection; a level's "
        f"clients share {args.total} requests, each sending its share in a row; clients are "
        "threads of the benchmark process on the same cores (loopback only)."
        + (f" {args.note}" if args.note else ""),
        "",
        "| clients | requests each | answered | failed | forward passes | p50 ms | p95 ms | "
        "p99 ms | max ms | texts/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['clients']} | {r['requests_each']} | {r['requests']} | {r['failed']} | "
            f"{r['forward_passes']} | {r['p50_ms']} | {r['p95_ms']} | {r['p99_ms']} | "
            f"{r['max_ms']} | {r['texts_per_s']} |"
            for r in rows
        ),
        "",
        f"Batching: {best['clients']} clients got {best['texts_per_s']} texts/s, "
        f"{best['texts_per_s'] / one['texts_per_s']:.2f}x one client's {one['texts_per_s']}.",
        "",
        f"Cold CLI, `attnlab predict RUN --threads {args.threads} --precision {args.precision}` "
        f"of the same three sentences in a fresh process: median {statistics.median(cli)} s "
        f"({', '.join(map(str, cli))}).",
    ]
    data = {"machine": info, "run": run.name, "server_said": said, "levels": rows,
            "cold_cli_s": cli}  # fmt: skip
    write_results(args.out, data, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
