"""T5, ELECTRA, ALBERT and DeBERTa-v2/v3 equal their Hugging Face classes (the verify checks, on
this test's seed), and each check fails when its model's new piece is broken."""

from __future__ import annotations

import pytest

from attnlab.verify import checks_zoo as zoo
from attnlab.verify.check import FAIL, PASS, Check, run_check

pytest.importorskip("transformers")

CHECKS = {
    "t5": Check("T5", "HF", 1e-9, zoo.check_t5),
    "electra": Check("ELECTRA", "HF", 1e-10, zoo.check_electra),
    "albert": Check("ALBERT", "HF", 1e-10, zoo.check_albert),
    "deberta": Check("DeBERTa", "HF", 1e-10, zoo.check_deberta),
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_parity_with_hugging_face(name, seed):
    row = run_check(CHECKS[name], seed)
    assert row.status == PASS, row


def test_t5_without_the_output_scale_fails(monkeypatch, seed):
    import torch.nn.functional as F

    from attnlab.models.t5 import T5

    monkeypatch.setattr(T5, "logits", lambda self, h: F.linear(h, self.shared.weight))
    assert run_check(CHECKS["t5"], seed).status == FAIL  # v1.0 cases scale by d_model^-0.5


def test_t5_with_the_bias_in_the_first_layer_only_fails(monkeypatch, seed):
    from attnlab.layers.blocks import Block

    calls = []
    original = Block.forward

    def forward(self, x, mask=None, *, bias=None, **kwargs):
        calls.append(1)
        return original(self, x, mask, bias=bias if len(calls) == 1 else None, **kwargs)

    monkeypatch.setattr(Block, "forward", forward)
    assert run_check(CHECKS["t5"], seed).status != PASS


def test_deberta_without_log_buckets_fails(monkeypatch, seed):
    from attnlab.models import deberta

    monkeypatch.setattr(deberta, "log_bucket_position", lambda r, b, m: r)
    # a case with buckets and a sequence longer than the exact range must disagree; a whole
    # check (6 cases) misses one about 6.5% of seeds (13 of 200, by hand), so 4 checks would pass by
    # chance about once in 50,000 runs, 8 checks once in 3e9
    rows = [run_check(CHECKS["deberta"], seed + i).status for i in range(8)]
    assert FAIL in rows


def test_deberta_without_p2c_fails(monkeypatch, seed):
    from attnlab.models.deberta import DisentangledSelfAttention

    original = DisentangledSelfAttention.__init__

    def init(self, cfg):
        original(self, cfg)
        self.p2c = False

    monkeypatch.setattr(DisentangledSelfAttention, "__init__", init)
    assert run_check(CHECKS["deberta"], seed).status != PASS


def test_albert_with_separate_layers_fails(monkeypatch, seed):
    from attnlab.models.albert import AlbertModel

    def forward(self, input_ids, lengths=None, token_type_ids=None):  # one pass, not n_layers
        from attnlab.layers.attention import padding_mask

        mask = None if lengths is None else padding_mask(lengths, input_ids.shape[1])
        x, _ = self.layer(self.project(self.embeddings(input_ids, token_type_ids)), mask)
        return x  # the check draws 2-3 layers, so one pass must disagree

    monkeypatch.setattr(AlbertModel, "forward", forward)
    assert run_check(CHECKS["albert"], seed).status == FAIL
