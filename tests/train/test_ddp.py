"""torchrun with 2 CPU ranks (gloo) must take the same steps as one process on the same
global batches: exact token weighting across ranks and micro-batches, rank-0-only outputs."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from _procs import curves, finish, launch, weights
from _tiny_task import TinyData

# No dropout: ranks draw different dropout masks by design (seed + rank), so only a
# dropout-free model can match a single process. 96 items in global micro-batches of 19 gives
# 5 batches of 19 and one of 1, so rank 1 gets an empty shard once per epoch; grad_accum=2.
ARGS = ["--dropout", "0", "batch_size=19", "grad_accum=2", "epochs=3", "log_every=1"]


def test_two_ranks_equal_one_process(tmp_path: Path) -> None:
    data = TinyData(batch_size=19)
    first = data.batches(0)[0]
    tokens = [data.num_tokens(data.collate(first[r::2])) for r in range(2)]
    assert tokens[0] != tokens[1], "shards must carry unequal token counts for a real test"
    assert len(data.batches(0)[-1]) == 1, "the last global batch must leave rank 1 empty"

    ddp = launch(tmp_path / "ddp", ARGS, nproc=2)
    single = launch(tmp_path / "single", ARGS)
    ddp_out, _ = finish(ddp, timeout=180), finish(single)

    got, want = (
        weights(tmp_path / "ddp/state/model.safetensors"),
        weights(tmp_path / "single/state/model.safetensors"),
    )
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-6)

    ddp_curves, single_curves = curves(tmp_path / "ddp"), curves(tmp_path / "single")
    assert [(r["step"], r["split"]) for r in ddp_curves] == [
        (r["step"], r["split"]) for r in single_curves
    ], "rank 0 alone must write each event"
    for a, b in zip(ddp_curves, single_curves):
        for key in ("loss", "acc", "val_loss", "val_acc"):
            if key in b:
                assert abs(a[key] - b[key]) < 1e-5, (a["step"], key, a[key], b[key])
    summary = json.loads((tmp_path / "ddp/summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 9
    assert ddp_out.count("precision fp32") == 1, "only rank 0 prints the precision line"


def test_two_single_process_nodes_over_loopback_equal_one_process(tmp_path: Path) -> None:
    """The README's multi-node command, as two one-process "nodes" meeting over loopback with
    torchrun's c10d rendezvous: the same steps as one process (and as two ranks on one node)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{s.getsockname()[1]}"
    nodes = [launch(tmp_path / "multi", ARGS, node=(rank, 2, endpoint)) for rank in (0, 1)]
    single = launch(tmp_path / "single", ARGS)
    outputs = [finish(node, timeout=180) for node in nodes]
    finish(single)
    got = weights(tmp_path / "multi/state/model.safetensors")
    want = weights(tmp_path / "single/state/model.safetensors")
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-6)
    summary = json.loads((tmp_path / "multi/summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 9
    assert sum(out.count("precision fp32") for out in outputs) == 1  # rank 0 alone
