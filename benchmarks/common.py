"""What every benchmark script shares: the machine it ran on, and writing its result page.

Run a script as ``python -m benchmarks.AREA.NAME [ARGS]`` from the repository root. Each
script defines ``main(argv: list[str] | None = None)``, parses ``argv`` with argparse before
any work, does no work at import time and ends with ``if __name__ == "__main__": main()``;
``tests/test_benchmarks.py`` finds every module under benchmarks/ (helpers: a name starting
with ``_``) and checks that ``main(["--help"])`` prints usage and exits 0.

API
---

``ROOT``, ``RESULTS``
    The repository root and ``docs/results/``.

``machine(threads=None, **extra) -> dict``
    What the numbers were measured on, one spelling for every page: ``cpu`` (model name),
    ``logical_cores`` (``os.cpu_count()``), ``torch_threads`` (``threads`` if given, else
    ``torch.get_num_threads()``), ``torch``, ``python``, ``device`` and
    ``load_average_at_start`` (1, 5, 15 min); ``extra`` keys are added as given (e.g.
    ``runs_at_once=2``). Call it before the work so the load average shows the other jobs.

``load_average() -> list[float]``
    The 1, 5 and 15 min load average now (store it as ``load_average_at_end``).

``set_threads(n) -> int``
    ``torch.set_num_threads(n)`` (and its inter-op twin where still settable); returns ``n``.

``command_line(argv=None) -> str``
    The exact command that is running, as ``python -m benchmarks.AREA.NAME ARG ...``
    (shell-quoted; ``argv`` defaults to ``sys.argv[1:]``).

``machine_line(info) -> str``
    One markdown line for a page: ``Machine: CPU, N logical cores, torch V with T thread(s),
    load average A at start[, B at end].`` (``info`` from ``machine()``, optionally with
    ``load_average_at_end``).

``upgrade_machine(info) -> dict``
    ``info`` in the one spelling above: result files written before this module spelled the
    core count ``cpus``, ``logical_cpus``, ``cpu_count`` or ``cores`` and the load averages
    ``load_average_start``/``load_average_end`` or ``load_start``/``load_end`` (1 min
    alone); pages re-rendered from them read it through this.

``write_page(path, markdown, command=None) -> Path``
    Writes the markdown page ``path`` with the ``Command: `...` `` line under its title (for
    scripts whose results stem is a path given on the command line).

``recorded_command(data, page) -> str``
    For a page re-rendered from a committed JSON (``--render``-style modes): the command
    stored in ``data["command"]``, else the one the existing ``page`` names, else the running
    one, so re-rendering never credits the numbers to the render command.

``write_results(stem, data, markdown, command=None, results_dir=RESULTS) -> (json, md)``
    Writes ``docs/results/STEM.json`` (``data`` plus ``"command"``) and ``STEM.md`` beside
    it. ``markdown`` is the page (a string or a list of lines) starting with its ``# title``;
    the line ``Command: `...` `` is inserted under the title (``command`` defaults to
    ``command_line()``). Every page in docs/results/ carries that line, and
    ``tests/test_benchmarks.py`` checks that the module it names exists.

Example::

    from benchmarks.common import load_average, machine, machine_line, write_results

    def main(argv=None):
        args = parser().parse_args(argv)
        info = machine(threads=set_threads(1))
        rows = measure(args)
        info["load_average_at_end"] = load_average()
        lines = ["# My benchmark", "", machine_line(info), "", *table(rows)]
        write_results("my_benchmark", {"machine": info, "rows": rows}, lines)
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
COMMAND_PREFIX = "Command: "
_COMMAND_LINE = re.compile(r"Command: `[^`]*`.*")  # a page's command line (and any note)


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load average, rounded (empty where the OS has none)."""
    if not hasattr(os, "getloadavg"):
        return []
    return [round(x, 2) for x in os.getloadavg()]


def set_threads(n: int) -> int:
    """Run torch on ``n`` threads (inter-op too while torch still allows it); returns ``n``."""
    import torch

    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # only settable before the first parallel work
        torch.set_num_interop_threads(n)
    return n


def machine(threads: int | None = None, device: str = "cpu", **extra: object) -> dict:
    """CPU model, logical cores, torch threads and version, Python, load average, extras."""
    import torch

    from attnlab.bench.machine import cpu_model

    info: dict = {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "torch_threads": threads if threads is not None else torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device,
        "load_average_at_start": load_average(),
    }
    if torch.device(device).type == "cuda":
        dev = torch.device(device)
        info["gpu"] = torch.cuda.get_device_name(dev)
        info["torch_cuda_build"] = torch.version.cuda
    info.update(extra)
    return info


def _fmt_load(load: Sequence[float] | None) -> str:
    return ", ".join(f"{x:.1f}" for x in load) if load else "unknown"


def machine_line(info: dict) -> str:
    """A one-line markdown description of ``machine()``'s dict."""
    line = (
        f"Machine: {info.get('cpu', 'unknown')}, {info.get('logical_cores')} logical cores, "
        f"torch {info.get('torch')} with {info.get('torch_threads')} thread(s); "
        f"load average {_fmt_load(info.get('load_average_at_start'))} at start"
    )
    if info.get("load_average_at_end"):
        line += f", {_fmt_load(info['load_average_at_end'])} at end"
    return line + "."


_LEGACY_KEYS = {
    "cpus": "logical_cores",
    "logical_cpus": "logical_cores",
    "cpu_count": "logical_cores",
    "cores": "logical_cores",
    "threads": "torch_threads",
    "load_average_start": "load_average_at_start",
    "load_average_end": "load_average_at_end",
    "load_start": "load_average_at_start",
    "load_end": "load_average_at_end",
}


def upgrade_machine(info: dict) -> dict:
    """``info`` with the keys of older result files renamed to ``machine()``'s spelling."""
    out = {}
    for key, value in info.items():
        new = _LEGACY_KEYS.get(key, key)
        if new == "logical_cores" and isinstance(value, str) and value.isdigit():
            value = int(value)
        if new.startswith("load_average_at_") and isinstance(value, (int, float)):
            value = [value]  # older files kept the 1-minute figure alone
        out.setdefault(new, value)
    return out


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return spec.name
    if not sys.argv[0].endswith(".py"):
        return "MODULE"  # python -c or an interactive session: no module to name
    path = Path(sys.argv[0]).resolve()
    try:
        rel = path.relative_to(ROOT).with_suffix("")
    except ValueError:
        return str(path)
    return ".".join(rel.parts)


def command_line(argv: Sequence[str] | None = None) -> str:
    """The running command as ``python -m MODULE ARGS`` (shell-quoted)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", "-m", _module_name(), *args])


def command_header(command: str) -> str:
    """The page line that names the command that made it."""
    return f"{COMMAND_PREFIX}`{command}`"


def with_command(markdown: str | Sequence[str], command: str) -> str:
    """``markdown`` with the command line under its title (replacing an older one)."""
    lines = markdown.splitlines() if isinstance(markdown, str) else list(markdown)
    kept: list[str] = []
    removed = False
    for ln in lines:
        if _COMMAND_LINE.fullmatch(ln):
            removed = True
            continue
        if removed and ln == "" and kept and kept[-1] == "":  # the blank line it left
            removed = False
            continue
        kept.append(ln)
        removed = False
    lines = kept
    at = 1 if lines and lines[0].startswith("# ") else 0
    block = ["", command_header(command)] if at else [command_header(command), ""]
    lines[at:at] = block
    text = "\n".join(lines)
    return text if text.endswith("\n") else text + "\n"


def write_page(path: Path, markdown: str | Sequence[str], command: str | None = None) -> Path:
    """Write the markdown page ``path`` naming ``command`` (default: the running one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(with_command(markdown, command or command_line()), encoding="utf-8")
    return path


def recorded_command(data: dict, page: Path) -> str:
    """The command that made ``data``: stored in it, named by ``page``, or the running one."""
    if isinstance(data.get("command"), str) and data["command"].startswith(("python", "attnlab")):
        return data["command"]
    page = Path(page)
    if page.exists():
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.startswith(COMMAND_PREFIX + "`"):
                return line[len(COMMAND_PREFIX) + 1 :].split("`", 1)[0]
    return command_line()


def write_results(
    stem: str,
    data: dict,
    markdown: str | Sequence[str],
    command: str | None = None,
    results_dir: Path = RESULTS,
) -> tuple[Path, Path]:
    """Write ``STEM.json`` and ``STEM.md`` under ``results_dir``; returns both paths."""
    command = command or command_line()
    results_dir.mkdir(parents=True, exist_ok=True)
    json_path = results_dir / f"{stem}.json"
    md_path = results_dir / f"{stem}.md"
    json_path.write_text(
        json.dumps({**data, "command": command}, indent=2, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
    write_page(md_path, markdown, command)
    return json_path, md_path
