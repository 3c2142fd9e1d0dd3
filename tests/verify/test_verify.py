"""``attnlab verify``: it passes on the installed oracles, and it catches a broken component.

* the whole command on this machine's oracles (--skip-missing: those installed): every row that
  runs passes, exit status 0, the JSON table;
* a component broken on purpose (monkeypatched to be off by 1%; bfloat16 would round 0.1% away)
  fails its row and makes the exit status 1: a core piece (SDPA), an HF-checked piece (the MoE
  experts), Mamba, Muon;
* a check whose oracle is not installed is no pass: the command refuses, naming the install,
  unless ``--skip-missing`` asks for the checks that can run (the others listed as skipped);
* a crashing check becomes an ERROR row; ``--only`` that matches nothing is a ValueError.
"""

from __future__ import annotations

import argparse
import json

import pytest

from attnlab.errors import UserError
from attnlab.verify import checks_torch, command, registry
from attnlab.verify.check import ERROR, FAIL, MISSING, PASS, Check, Oracle, run_check

pytest.importorskip("transformers")


def verify(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers(dest="command"))
    return command.run(parser.parse_args(["verify", *argv]))


def by_component(path) -> dict:
    return {row["component"]: row for row in json.loads(path.read_text())["rows"]}


@pytest.mark.slow
def test_every_check_passes_on_the_installed_oracles(tmp_path, seed, capsys):
    out = tmp_path / "verify.json"
    assert verify("--seed", str(seed), "--json", str(out), "--skip-missing") == 0
    text = capsys.readouterr().out
    assert f"seed {seed}" in text and "max abs error" in text
    rows = by_component(out)
    assert len(rows) == len(registry.CHECKS)
    for name, row in rows.items():
        assert row["status"] in (PASS, MISSING), (name, row)
        if row["status"] == PASS:
            assert row["cases"] > 0 and row["max_abs_error"] <= row["tolerance"], name
    for name in ("scaled_dot_product_attention", "MoEFeedForward (f32)", "BERT"):
        assert rows[name]["status"] == PASS  # these oracles are installed with the tests
    meta = json.loads(out.read_text())["meta"]
    assert meta["seed"] == seed and meta["threads"] == 1 and len(meta["loadavg"]) == 3


def off_by_a_little(fn):
    def broken(*args, **kwargs):
        out = fn(*args, **kwargs)
        return (out[0] * 1.01, *out[1:]) if isinstance(out, tuple) else out * 1.01

    return broken


def test_a_broken_attention_kernel_fails_its_row_and_the_exit_status(tmp_path, monkeypatch):
    sdpa = checks_torch.scaled_dot_product_attention
    monkeypatch.setattr(checks_torch, "scaled_dot_product_attention", off_by_a_little(sdpa))
    out = tmp_path / "v.json"
    assert verify("--seed", "1", "--only", "scaled_dot,Block", "--json", str(out)) == 1
    rows = by_component(out)
    assert rows["scaled_dot_product_attention"]["status"] == FAIL
    assert rows["scaled_dot_product_attention"]["max_abs_error"] > 1e-4
    assert rows["Block (encoder layer)"]["status"] == PASS  # its attention is not the patched name


def test_broken_moe_experts_and_mamba_fail_their_rows(monkeypatch, seed):
    from attnlab.layers.moe import MoEFeedForward
    from attnlab.layers.rwkv import TimeMix
    from attnlab.layers.ssm import MambaBlock

    monkeypatch.setattr(MoEFeedForward, "expert", off_by_a_little(MoEFeedForward.expert))
    monkeypatch.setattr(MambaBlock, "forward", off_by_a_little(MambaBlock.forward))
    monkeypatch.setattr(TimeMix, "forward", off_by_a_little(TimeMix.forward))
    checks = {c.component: c for c in registry.CHECKS}
    for name in (
        "MoEFeedForward (f32)",
        "MoEFeedForward gradients (f32)",
        "Mamba GPT logits/greedy/cache (f32)",
        "Mamba GPT gradients (f32)",
        "RWKV GPT logits/greedy/cache (f32)",
        "RWKV GPT gradients (f32)",
    ):
        row = run_check(checks[name], seed)
        assert row.status == FAIL, (name, row)
    assert run_check(checks["MoE balance loss"], seed).status == PASS


def test_a_broken_muon_fails_both_optimizer_rows(monkeypatch, seed):
    from attnlab.train import muon

    monkeypatch.setattr(muon, "newton_schulz", off_by_a_little(muon.newton_schulz))
    checks = {c.component: c for c in registry.CHECKS}
    for name in ("Muon", "MuonAdamW"):
        assert run_check(checks[name], seed).status == FAIL, name


def test_a_check_whose_oracle_is_missing_is_not_a_pass(monkeypatch, capsys, tmp_path):
    """transformers made to look uninstalled: the DeiT row cannot run, so the command refuses in
    one line naming the install (exit 2, no table written) instead of exiting 0; asked for the
    checks that can run (--skip-missing), it runs them and lists DeiT as skipped, not passed;
    with nothing left to run it still refuses."""
    from attnlab.cli import main

    available = Oracle.available
    monkeypatch.setattr(Oracle, "available", lambda o: o.module != "transformers" and available(o))
    out = tmp_path / "v.json"
    only = ["--seed", "1", "--only", "scaled_dot,deit", "--json", str(out)]
    capsys.readouterr()
    assert main(["verify", *only]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "1 of the 3 checks cannot run" in err
    assert "transformers" in err and "pip install 'attnlab[verify]'" in err
    assert "--skip-missing to run the other 2" in err and not out.exists()
    assert verify(*only, "--skip-missing") == 0
    rows = by_component(out)
    assert rows["DeiT (distillation token)"]["status"] == MISSING
    assert not rows["DeiT (distillation token)"]["passed"]
    assert rows["scaled_dot_product_attention"]["status"] == PASS
    assert "1 skipped, oracle not installed" in capsys.readouterr().out
    with pytest.raises(UserError, match="none of the 2 checks can run.*pip install"):
        verify("--only", "deit,swin attention", "--skip-missing")


def test_missing_oracle_is_listed_with_its_install_command(monkeypatch, capsys):
    absent = Oracle("attnlab_no_such_oracle", "pip install attnlab-no-such-oracle")
    fake = Check("fake", "nothing", 1e-9, lambda m: None, (absent,))
    monkeypatch.setattr(registry, "CHECKS", [fake, *registry.CHECKS[:1]])
    assert verify("--list") == 0
    assert "(not installed: attnlab_no_such_oracle)" in capsys.readouterr().out.splitlines()[0]
    assert verify("--seed", "3", "--skip-missing") == 0
    text = capsys.readouterr().out
    assert "missing" in text and "pip install attnlab-no-such-oracle" in text


def test_a_crashing_check_is_an_error_row():
    def crash(m):
        raise RuntimeError("boom")

    row = run_check(Check("crash", "none", 1e-9, crash), 0)
    assert row.status == ERROR and "boom" in row.note
    empty = run_check(Check("empty", "none", 1e-9, lambda m: None), 0)
    assert empty.status == FAIL and "no case" in empty.note


def test_only_that_matches_nothing_names_the_checks():
    with pytest.raises(ValueError, match="matches no check.*MultiHeadAttention"):
        verify("--only", "nonexistent")
