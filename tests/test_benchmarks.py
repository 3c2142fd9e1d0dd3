"""Every benchmark script starts, and every result page names the command that made it.

Scripts are found by walking benchmarks/, so a new one is covered without editing this file.
A module whose name starts with ``_`` is a helper that scripts import, not a script. A page
whose script was retired says so on its command line, and docs/results/LOG.md tells that run.
docs/results/README.md is the index: it measures nothing itself and lists every page.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
RESULTS = ROOT / "docs" / "results"
NOT_SCRIPTS = {"benchmarks.common"}


def script_modules() -> list[str]:
    names = []
    for path in sorted(BENCHMARKS.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        if any(part.startswith("_") for part in rel.parts):
            continue
        name = ".".join(rel.parts)
        if name not in NOT_SCRIPTS:
            names.append(name)
    return names


def helper_modules() -> list[str]:
    return [
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in sorted(BENCHMARKS.rglob("_*.py"))
        if p.name != "__init__.py"
    ]


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))


def test_scripts_found():
    assert len(script_modules()) >= 30


@pytest.mark.parametrize("name", helper_modules() + sorted(NOT_SCRIPTS))
def test_helper_imports(name):
    importlib.import_module(name)


@pytest.mark.parametrize("name", script_modules())
def test_help_prints_and_exits_zero(name, monkeypatch):
    module = importlib.import_module(name)  # import alone must do no work
    assert callable(getattr(module, "main", None)), f"{name} has no main()"
    source = Path(module.__file__).read_text(encoding="utf-8")
    assert 'if __name__ == "__main__":' in source, f"{name} runs nothing as a script"
    assert "sys.path.insert" not in source, f"{name}: import other scripts as benchmarks.*"
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code in (0, None), out.getvalue()
    assert "usage:" in out.getvalue()


COMMAND_LINE = re.compile(r"^Command: `(?P<cmd>[^`]+)`(?P<rest>.*)$", re.MULTILINE)
RETIRED = "(retired, see LOG.md)"  # the script is gone; LOG.md tells its finding and commit
LOG = RESULTS / "LOG.md"
INDEX = RESULTS / "README.md"


def cli_commands() -> set[str]:
    cli = (ROOT / "src" / "attnlab" / "cli.py").read_text(encoding="utf-8")
    commands = re.findall(r'add_parser\(\s*"([\w-]+)"', cli)  # sub.add_parser("eval", ...)
    commands += re.findall(r'^\s*"([\w-]+)": \(', cli, re.MULTILINE)  # the command table
    return set(commands)


def pages() -> list[Path]:
    return sorted(RESULTS.rglob("*.md"))


def split_commands(line: str) -> list[str]:
    """The shell commands of a Command line, split at ``;`` and ``&&`` outside quotes (a
    quoted label may hold either)."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&")
    lex.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lex:
        if token in (";", "&&"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [shlex.join(words) for words in commands if words]


def check_command(cmd: str, known_cli: set[str]) -> None:
    """One shell command of a page: a benchmark module or attnlab subcommand that exists."""
    words = shlex.split(cmd)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # OMP_NUM_THREADS=1 ...
        words.pop(0)
    assert words, cmd
    if words[0] in ("python", "python3") and words[1:2] == ["-m"]:
        module = words[2]
        if module == "attnlab":
            words = ["attnlab", *words[3:]]
        else:
            assert module.startswith("benchmarks."), cmd
            assert importlib.util.find_spec(module) is not None, f"no module {module}"
            return
    assert words[0] == "attnlab", f"not a benchmark or attnlab command: {cmd}"
    assert len(words) > 1 and words[1] in known_cli, f"no attnlab command {words[1:2]}: {cmd}"


def test_pages_found():
    assert len(pages()) >= 50


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_page_names_its_command(page):
    text = page.read_text(encoding="utf-8")
    found = COMMAND_LINE.findall(text)
    assert found or page in (LOG, INDEX), f"{page.name}: no line 'Command: `...`'"
    known = cli_commands()
    for line, rest in found:
        if RETIRED in rest:
            log = LOG.read_text(encoding="utf-8")
            assert page.name in log and line in log, f"LOG.md does not tell {page.name}'s run"
            continue
        for cmd in split_commands(line):
            check_command(cmd, known)


def test_index_lists_every_page_once():
    """The index's last section links each result page exactly once, and nothing else."""
    section = INDEX.read_text(encoding="utf-8").split("## Every page")[-1]
    listed = re.findall(r"\]\(([^)#]+\.md)\)", section)  # [name](page.md)
    on_disk = [str(p.relative_to(RESULTS)) for p in pages() if p != INDEX]
    assert sorted(listed) == sorted(on_disk)
