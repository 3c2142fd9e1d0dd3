"""skipping_init: models built for a strict load draw no random numbers, on that thread only,
and torch's initialisers are themselves again afterwards."""

from __future__ import annotations

import threading

import torch

from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.skip_init import init_skipped, skipping_init

PACKED = BertConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64, context=16,
                    packed_words=True)  # fmt: skip


def test_a_model_built_inside_draws_nothing_and_loads_to_the_same_outputs():
    torch.manual_seed(0)
    source = BertModel(PACKED).eval()
    before = torch.get_rng_state()
    with skipping_init():
        assert init_skipped()
        target = BertModel(PACKED)
    assert torch.equal(torch.get_rng_state(), before)  # no weight was drawn
    BertModel(PACKED)
    assert not torch.equal(torch.get_rng_state(), before)  # outside, they are
    target.load_state_dict(source.state_dict(), strict=True)
    ids = torch.randint(0, 64, (2, 7))
    assert torch.equal(target.eval()(ids), source(ids))


def test_torchs_initialisers_are_restored_and_other_threads_still_draw():
    original = torch.nn.init.normal_
    seen: dict[str, bool] = {}

    def elsewhere() -> None:
        t = torch.zeros(50)
        torch.nn.init.normal_(t)
        seen["drew"] = bool(t.abs().sum() > 0)

    with skipping_init(), skipping_init():  # nested: restored only when the outer one ends
        t = torch.zeros(50)
        torch.nn.init.normal_(t)
        assert not t.any()
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    assert seen["drew"]
    assert torch.nn.init.normal_ is original and not init_skipped()
    t = torch.zeros(50)
    torch.nn.init.normal_(t)
    assert t.any()
