"""Integrated gradients and gradient × input over a fine-tuned encoder's word vectors, against
captum's IntegratedGradients (the oracle), a float64 finite difference and the completeness
axiom; the text's pieces told apart from <s>, </s> and e5's "query: " prefix."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from attnlab.infer.attribution import (
    attribute,
    log_odds,
    logits_from_words,
    prompt_prefix,
    reference_vectors,
    text_pieces,
    word_vectors,
)
from attnlab.infer.classifier import ClassifierRun

sys.path.insert(0, str(Path(__file__).parents[1]))
import _runs  # noqa: E402

TEXTS = ["电影前半段很无聊，但是结局让我感动", "great movie, bad ending", "好看"]


@pytest.fixture(scope="module")
def e5(tmp_path_factory: pytest.TempPathFactory) -> ClassifierRun:
    """A tiny random e5-layout classifier (real tokenizer with the query prefix), float64."""
    run = ClassifierRun.load(_runs.e5_run(tmp_path_factory.mktemp("attr") / "e5", "mean"))
    run.model.double()
    return run


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> ClassifierRun:
    """A tiny random BERT with MiniLM's WordPiece vocabulary and [CLS] pooling, float64."""
    run = ClassifierRun.load(_runs.bert_run(tmp_path_factory.mktemp("attr") / "bert", "cls"))
    run.model.double()
    return run


def _ids(run: ClassifierRun, text: str) -> tuple[torch.Tensor, tuple[int, int]]:
    ids = torch.tensor([run.tokenizer.encode(text, run.max_len)])  # (1, T)
    return ids, text_pieces(run.tokenizer, text, ids.shape[1])


@pytest.mark.parametrize("name", ["e5", "minilm"])
@pytest.mark.parametrize("text", TEXTS)
def test_forward_from_word_vectors_is_the_models(name, text, request):
    run = request.getfixturevalue(name)
    ids, _ = _ids(run, text)
    want = run.model(ids, torch.tensor([ids.shape[1]]))  # (1, C)
    got = logits_from_words(run.model, ids, word_vectors(run.model, ids))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_pieces_of_the_text_apart_from_specials_and_prefix(e5, minilm):
    from attnlab.data.sentencepiece import SentencePieceTokenizer
    from attnlab.models.e5 import tokenizer_path

    plain = SentencePieceTokenizer.load(tokenizer_path())  # no prefix
    assert prompt_prefix(e5.tokenizer) == "query: "
    assert prompt_prefix(plain) == prompt_prefix(minilm.tokenizer) == ""
    for text in TEXTS + ["Query: x", "query: the prefix typed by the user"]:
        tokens = e5.tokenizer.tokens(text, e5.max_len)
        start, stop = text_pieces(e5.tokenizer, text, len(tokens))
        assert tokens[:start] == ["<s>", "▁que", "ry", ":"] and tokens[stop:] == ["</s>"]
        assert tokens[start:stop] == plain.tokens(text, e5.max_len)[1:-1]
        tokens = minilm.tokenizer.tokens(text, minilm.max_len)
        assert text_pieces(minilm.tokenizer, text, len(tokens)) == (1, len(tokens) - 1)
    long = "好" * 200  # truncated: the text keeps the pieces that fit, </s> stays last
    tokens = e5.tokenizer.tokens(long, 20)
    assert text_pieces(e5.tokenizer, long, len(tokens)) == (4, 19)


@pytest.mark.parametrize("name", ["e5", "minilm"])
@pytest.mark.parametrize("steps", [8, 32])
def test_integrated_gradients_match_captum(name, steps, request):
    from captum.attr import IntegratedGradients

    run = request.getfixturevalue(name)
    model = run.model
    for text in TEXTS:
        ids, span = _ids(run, text)
        ours = attribute(model, ids, span, "ig", steps=steps)
        k = ours["target"]

        def f(words: torch.Tensor, ids=ids, k=k) -> torch.Tensor:  # (B, T, D) -> (B,)
            return log_odds(logits_from_words(model, ids.expand(len(words), -1), words), k)

        ig = IntegratedGradients(f)
        x, ref = word_vectors(model, ids), reference_vectors(model, ids, span)
        want, delta = ig.attribute(
            x, baselines=ref, n_steps=steps, method="gausslegendre", return_convergence_delta=True
        )
        want = want.sum(-1)[0].detach()  # (T,)
        # captum rounds its quadrature weights to float32 (torch.tensor(step_sizes).float()):
        # agreement to ~1e-6 of the largest score; a wrong node, weight or path is far larger
        scale = float(want.abs().max())
        torch.testing.assert_close(ours["scores"], want, rtol=1e-5, atol=1e-6 * scale)
        assert ours["gap"] == pytest.approx(float(delta), abs=1e-6 * max(scale, 1.0))
        outside = torch.ones_like(want, dtype=torch.bool)
        outside[span[0] : span[1]] = False
        assert (ours["scores"][outside] == 0).all()  # kept in the reference: no score


def test_integrated_gradients_are_complete(e5, minilm):
    """Σ_t IG_t = f(e) − f(e') (Sundararajan et al. 2017, Prop. 1), up to the quadrature."""
    for run in (e5, minilm):
        for text in TEXTS:
            ids, span = _ids(run, text)
            out = attribute(run.model, ids, span, "ig", steps=64)
            change = out["log_odds"] - out["reference_log_odds"]
            assert abs(out["gap"]) <= 1e-6 * max(1.0, abs(change)), (text, out["gap"], change)
            assert float(out["scores"].sum()) == pytest.approx(change, abs=1e-6)


@pytest.mark.parametrize("name", ["e5", "minilm"])
def test_gradient_times_input_is_a_directional_derivative(name, request):
    """Each piece's score is d/dh f(e + h·(e − e')_t) at h = 0: a float64 central difference."""
    run = request.getfixturevalue(name)
    model = run.model
    text = TEXTS[0]
    ids, span = _ids(run, text)
    out = attribute(model, ids, span, "gxi")
    x, ref = word_vectors(model, ids), reference_vectors(model, ids, span)
    h = 1e-5
    for t in range(span[0], span[1]):
        step = torch.zeros_like(x)
        step[0, t] = x[0, t] - ref[0, t]
        with torch.no_grad():
            up = log_odds(logits_from_words(model, ids, x + h * step), out["target"])
            down = log_odds(logits_from_words(model, ids, x - h * step), out["target"])
        numeric = float((up - down) / (2 * h))
        assert float(out["scores"][t]) == pytest.approx(numeric, rel=1e-6, abs=1e-8), t


def test_attribution_leaves_the_model_as_it_was(e5):
    ids, span = _ids(e5, TEXTS[0])
    e5.model.train()
    attribute(e5.model, ids, span)
    assert e5.model.training
    e5.model.eval()
    assert all(p.grad is None for p in e5.model.parameters())
    with pytest.raises(ValueError, match="method"):
        attribute(e5.model, ids, span, "rollout")


def test_log_odds_of_the_target_class():
    logits = torch.randn(5, 3, dtype=torch.float64)
    p = torch.softmax(logits, dim=-1)
    for k in range(3):
        want = torch.log(p[:, k]) - torch.log1p(-p[:, k])
        torch.testing.assert_close(log_odds(logits, k), want, rtol=1e-12, atol=1e-12)
