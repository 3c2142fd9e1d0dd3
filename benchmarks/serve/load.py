"""`attnlab serve` under 1, 8 and 32 concurrent loopback clients, beside the cold CLI.

    python -m benchmarks.serve.load RUN [--requests 8] [--threads 1] [--cli-rounds 3]
        -> docs/results/serve_load.{json,md}

Starts ``attnlab serve RUN --port 0`` in a child process (float32, ``--threads`` intra-op
threads, batches of up to 64 texts). For each concurrency level, that many client threads each
send ``--requests`` requests one after another (a bounded loop), every request the tutorial's
three sentences; the page gives each level's request latency (p50, p95, max, from sending to
the parsed answer) and throughput (texts answered per second of the level's wall time), and
the forward passes the server ran for them (from GET /health: fewer than requests means
requests shared a pass). Beside it, the cold CLI: ``attnlab predict RUN`` of the same three
sentences in a fresh process, median of ``--cli-rounds``. The clients run in this process
(Python threads, mostly waiting on sockets) on the same cores as the server.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
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
LEVELS = (1, 8, 32)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a trained classifier run folder")
    p.add_argument("--requests", type=int, default=8, help="requests per client per level")
    p.add_argument("--threads", type=int, default=1, help="the server's --threads")
    p.add_argument("--cli-rounds", type=int, default=3)
    p.add_argument("--out", default=STEM, help="results stem under docs/results/")
    return p


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def start_server(run: str, threads: int) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "attnlab", "serve", run, "--port", "0", "--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=env())  # fmt: skip
    found = re.search(r"http://127\.0\.0\.1:(\d+)/", proc.stdout.readline())
    if not found:
        proc.kill()
        raise SystemExit("the server did not start")
    return proc, int(found.group(1))


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


def level(port: int, clients: int, requests: int) -> dict:
    """``clients`` threads, each ``requests`` requests in a row: latencies and throughput."""
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
        "requests": n,
        "failed": len(failures),
        "forward_passes": passes,
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p95_ms": round(latencies[min(n - 1, round(0.95 * (n - 1)))] * 1000, 1),
        "max_ms": round(latencies[-1] * 1000, 1),
        "texts_per_s": round(n * len(SENTENCES) / wall, 1),
        "wall_s": round(wall, 2),
    }


def cold_cli(run: str, rounds: int, threads: int) -> list[float]:
    cmd = [sys.executable, "-m", "attnlab", "predict", run, "--threads", str(threads), *SENTENCES]
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env())
        times.append(round(time.perf_counter() - start, 2))
    return times


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    info = machine(threads=args.threads)
    proc, port = start_server(args.run, args.threads)
    try:
        body = json.dumps({"texts": SENTENCES}, ensure_ascii=False).encode()
        for _ in range(3):  # warm the server's paths
            call(port, "POST", "/predict", body)
        rows = [level(port, clients, args.requests) for clients in LEVELS]
    finally:
        proc.terminate()
        proc.wait(60)
    cli = cold_cli(args.run, args.cli_rounds, args.threads)
    info["load_average_at_end"] = load_average()
    run = Path(args.run).resolve()
    lines = [
        "# attnlab serve under concurrent loopback clients, beside the cold CLI",
        "",
        machine_line(info),
        "",
        f"Run: `{run}`; the server `attnlab serve RUN --threads {args.threads}` (float32, "
        "batches of up to 64 texts); each request is the tutorial's three sentences; each "
        f"client sends {args.requests} requests in a row; clients are threads of the "
        "benchmark process on the same cores.",
        "",
        "| clients | answered | failed | forward passes | p50 ms | p95 ms | max ms | texts/s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['clients']} | {r['requests']} | {r['failed']} | {r['forward_passes']} | "
            f"{r['p50_ms']} | "
            f"{r['p95_ms']} | {r['max_ms']} | {r['texts_per_s']} |"
            for r in rows
        ),
        "",
        f"Cold CLI, `attnlab predict RUN --threads {args.threads}` of the same three sentences "
        f"in a fresh process: median {statistics.median(cli)} s ({', '.join(map(str, cli))}).",
    ]
    data = {"machine": info, "run": str(run), "levels": rows, "cold_cli_s": cli}
    write_results(args.out, data, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
