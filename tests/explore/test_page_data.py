"""The page's numbers equal the model's: weights, raw scores, masks, predictions, per run kind.

Each test writes a page with `attnlab explore`, reads the data back out of the HTML and
compares it with what the model returns through its own (non-recording) code path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnlab.cli import main
from attnlab.data import pad_batch
from attnlab.data.images import normalize
from attnlab.explore import pack
from attnlab.explore.page import explore_data, read_page_data
from attnlab.explore.sources import load_source
from attnlab.layers.attention import padding_mask

TOL = 1e-6


def _page(run: Path, out: Path, *inputs: str, extra: tuple[str, ...] = ()) -> dict:
    assert main(["explore", str(run), *inputs, "--out", str(out), *extra]) == 0
    return read_page_data(out.read_text(encoding="utf-8"))


def _weights(group: dict) -> np.ndarray:
    shape = (group["layers"], group["heads"], group["tq"], group["tk"])
    return pack.decode_f32(group["weights"], shape)


def _scores(group: dict) -> np.ndarray:
    shape = (group["layers"], group["heads"], group["tq"], group["tk"])
    return pack.decode_f32(group["scores"], shape)


def _mask(group: dict) -> np.ndarray:
    import base64

    raw = np.frombuffer(base64.b64decode(group["mask"]), np.uint8)
    return raw.reshape(group["tq"], group["tk"]).astype(bool)


def _softmax_check(group: dict) -> None:
    """What the page's slider computes at s = 1/√d_k gives the stored weights back."""
    scores, weights, mask = _scores(group).astype(np.float64), _weights(group), _mask(group)
    logits = np.where(mask, scores * group["scale"], -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    assert np.abs(probs - weights).max() < TOL
    assert group["d_k"] == round(group["scale"] ** -2)


def test_classifier_page_equals_inspect(runs, tmp_path):
    texts = ["好看极了精彩感人", "剧情拖沓"]
    data = _page(runs["classifier"], tmp_path / "p.html", *texts)
    run = load_source(runs["classifier"]).run
    ids, lengths = run.encode(texts)
    info = run.model.inspect(ids, lengths)  # attention (L, B, H, T, T), the model's own path
    preds = run.predict(texts)
    assert data["kind"] == "classifier" and len(data["examples"]) == 2
    for b, ex in enumerate(data["examples"]):
        (group,) = ex["groups"]
        n = int(lengths[b])  # each input keeps its own length: no padding drawn
        want = info["attention"][:, b, :, :n, :n].numpy()
        assert _weights(group).shape == want.shape == (2, 2, n, n)
        assert np.abs(_weights(group) - want).max() < TOL
        _softmax_check(group)
        assert _mask(group).all() and len(group["query_tokens"]) == n
        assert ex["prediction"]["label"] == preds[b]["label"]
        assert ex["prediction"]["probs"] == pytest.approx(preds[b]["probs"])
        assert ex["token_share"] == pytest.approx(info["token_share"][b, :n].tolist())
    short = data["examples"][1]["groups"][0]
    assert "<pad>" not in short["query_tokens"] and int(lengths[1]) < ids.shape[1]


def test_classifier_page_flags_a_text_of_unseen_characters(runs, tmp_path):
    data = _page(runs["classifier"], tmp_path / "p.html", "好看极了", "鼋鼍蛟龙好")
    known, unseen = (ex["prediction"] for ex in data["examples"])
    assert known["unknown_share"] == 0.0 and known["out_of_reach"] is False
    assert unseen["unknown_share"] == pytest.approx(0.8) and unseen["out_of_reach"] is True
    assert "never (or rarely) seen in training" in unseen["warning"]


def test_gpt_page_equals_the_stack_and_generate(runs, tmp_path):
    from attnlab.infer.lm import generate_text

    data = _page(runs["gpt"], tmp_path / "p.html", "To be", extra=("--max-new-tokens", "6"))
    source = load_source(runs["gpt"])
    model, tok = source.run.model, source.run.tokenizer
    (ex,) = data["examples"]
    gen = ex["generation"]
    want_text = generate_text(model, tok, "To be", 6, temperature=0.0).texts[0]
    assert gen["text"] == want_text and len(gen["steps"]) == 6
    ids = torch.tensor([tok.encode("To be" + want_text)])  # (1, T)
    with torch.no_grad():
        x = model.pos_emb(model.tok_emb(ids))
        _, weights = model.stack(x, is_causal=True, need_weights=True)
        probs = torch.softmax(model(ids)[0], -1)  # (T, V)
    (group,) = ex["groups"]
    assert group["causal"] and np.array_equal(_mask(group), np.tril(np.ones((11, 11), bool)))
    assert np.abs(_weights(group) - torch.stack(weights)[:, 0].numpy()).max() < TOL
    _softmax_check(group)
    for step in gen["steps"]:
        p = step["position"]
        assert step["prob"] == pytest.approx(float(probs[p - 1, ids[0, p]]), abs=1e-6)
        assert [t["prob"] for t in step["top"]] == pytest.approx(
            probs[p - 1].topk(10).values.tolist(), abs=1e-6
        )
        # the temperature slider's logits: the whole (character) vocabulary, in the model's order
        assert gen["whole_vocab"] and len(step["logits"]) == probs.shape[-1]
        at_t1 = torch.softmax(torch.tensor(step["logits"], dtype=torch.float64), -1)
        assert at_t1[:10].tolist() == pytest.approx([t["prob"] for t in step["top"]], abs=1e-5)


def test_translation_page_equals_the_decoder(runs, tmp_path):
    data = _page(runs["translate"], tmp_path / "p.html", "the cat sat")
    run = load_source(runs["translate"]).run
    (ex,) = data["examples"]
    assert ex["translation"]["text"] == run.translate(["the cat sat"])[0]
    cross, enc, dec = ex["groups"]
    src = torch.tensor([run.src_tok.encode("the cat sat")])
    tgt = torch.tensor([[1, *[run.tgt_tok.tok.token_to_id(t) for t in dec["query_tokens"][1:]]]])
    model = run.model
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        x = model._embed(model.src_embed, src)
        _, enc_w = model.encoder(x, src_mask, need_weights=True)
        y = model._embed(model.tgt_embed, tgt)
        _, dec_w = model.decoder(y, memory, None, src_mask, is_causal=True, need_weights=True)
    assert (cross["tq"], cross["tk"]) == (tgt.shape[1], src.shape[1])
    assert cross["query_tokens"][-1] == "</s>"
    for group, want in (
        (enc, torch.stack(enc_w)),
        (dec, torch.stack([w for w, _ in dec_w])),
        (cross, torch.stack([w for _, w in dec_w])),
    ):
        assert np.abs(_weights(group) - want[:, 0].numpy()).max() < TOL
        _softmax_check(group)
    assert dec["causal"] and not cross["causal"] and _mask(cross).all()


def test_vit_page_equals_inspect_and_rollout(runs, tmp_path):
    from attnlab.models.vit import rollout_map

    data = _page(runs["vit"], tmp_path / "p.html", str(runs["image"]))
    run = load_source(runs["vit"]).run
    x = normalize(run.load_images([str(runs["image"])]), run.report["mean"], run.report["std"])
    info = run.model.inspect(x)
    (ex,) = data["examples"]
    (group,) = ex["groups"]
    assert np.abs(_weights(group) - info["attention"][:, 0].numpy()).max() < TOL
    _softmax_check(group)
    assert group["query_tokens"][:2] == ["[cls]", "p0,0"] and group["tq"] == 1 + 16
    roll = pack.decode_f32(ex["patches"]["rollout"], (4, 4))
    assert np.abs(roll - rollout_map(run.model, x)[0].numpy()).max() < TOL
    assert (
        ex["image"]["width"] == 28
        and ex["prediction"]["label"] == run.predict([str(runs["image"])])[0]["label"]
    )


@pytest.mark.parametrize("kind", ["cnn", "cnn_ca"])
def test_cnn_page_gates_equal_the_modules(runs, tmp_path, kind):
    data = _page(runs[kind], tmp_path / "p.html", str(runs["image"]))
    run = load_source(runs[kind]).run
    x = normalize(run.load_images([str(runs["image"])]), run.report["mean"], run.report["std"])
    seen = {}

    def keep(i):
        def hook(module, args, out):
            seen[i] = (module.gate(args[0]), args[0])  # the module's own total gate

        return hook

    hooks = [b.attention.register_forward_hook(keep(i)) for i, b in enumerate(run.model.blocks)]
    with torch.no_grad():
        run.model(x)
    for h in hooks:
        h.remove()
    gates = data["examples"][0]["gates"]
    assert len(gates) == len(run.model.blocks) == 2
    for i, g in enumerate(gates):
        total, feats = seen[i]  # the module's own gate(x): (1, C, H, W)
        if kind == "cnn":
            channel = torch.tensor(g["channel"])[:, None, None]
            spatial = torch.tensor(pack.decode_f32(g["spatial"], (g["h"], g["w"])).copy())
            assert (channel * spatial - total[0]).abs().max() < TOL
        else:
            spatial = pack.decode_f32(g["spatial"], (g["h"], g["w"]))
            assert np.abs(spatial - total[0].mean(0).numpy()).max() < TOL
            g_h, _ = run.model.blocks[i].attention.gates(feats)
            assert g["rows"] == pytest.approx(g_h[0, :, :, 0].mean(0).tolist(), abs=1e-6)


def test_minilm_page_equals_our_bert_and_hugging_face(tmp_path):
    transformers = pytest.importorskip("transformers")
    from attnlab.models.minilm import folder as minilm_folder

    texts = ["The cat sat on the mat.", "A dog barked loudly at the passing mail van."]
    source = load_source("minilm")
    data = explore_data(source, texts)
    enc = source.run
    ids, lengths = pad_batch(enc.tokenizer.encode_batch(texts, enc.max_len), enc.tokenizer.pad_id)
    bert = enc.model
    with torch.no_grad():
        x = bert.embeddings(ids)
        _, ours = bert.encoder(x, padding_mask(lengths), need_weights=True)
    path = minilm_folder()
    hf = transformers.BertModel.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = hf(input_ids=ids, attention_mask=(ids != 0).long(), output_attentions=True)
    for b, ex in enumerate(data["examples"]):
        (group,) = ex["groups"]
        page = _weights(group)
        n = int(lengths[b])  # each input its own length: the real rows and columns
        assert page.shape == (6, 12, n, n)
        assert np.abs(page - torch.stack(ours)[:, b, :, :n, :n].numpy()).max() < TOL
        hf_w = torch.stack(theirs.attentions)[:, b, :, :n, :n].numpy()
        assert np.abs(page - hf_w).max() < 1e-5
        assert group["query_tokens"][0] == "[CLS]" and sum(ex["token_share"]) == pytest.approx(1)
        assert ex["similarity"][0]["cosine"] == pytest.approx(
            float(enc.encode(texts)[0] @ enc.encode(texts)[1]), abs=1e-4
        )


def test_scores_are_left_out_past_the_budget(runs, monkeypatch):
    monkeypatch.setattr(pack, "SCORE_BUDGET", 10)
    data = explore_data(load_source(runs["classifier"]), ["好看极了"])
    group = data["examples"][0]["groups"][0]
    assert group["scores"] is None and "budget" in group["scores_note"]
    assert group["weights"]  # the weights are always there


def test_page_is_self_contained_and_light(runs, tmp_path):
    out = tmp_path / "p.html"
    _page(runs["classifier"], out, "好看极了</script><script>alert(1)</script>")
    html = out.read_text(encoding="utf-8")
    assert "http://" not in html and "https://" not in html and "<link" not in html
    assert html.count("</script>") == 2  # the data's "</script>" cannot end its element
    data = read_page_data(html)
    assert data["examples"][0]["input"].endswith("</script>")
    assert out.stat().st_size < 200_000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{run}", ""], "input 1 is empty"),
        (["{run}"], "no input given"),
        (["{run}", "好看", "--view", "head"], "give --png FILE too"),
        (["{run}", "好看", "--max-chars", "1"], "over the limit of 1"),
        (["{run}", "好看", "--member", "2"], "not an ensemble"),
        (["{tmp}", "x"], "not a run directory"),
    ],
)
def test_bad_input_is_one_line(runs, tmp_path, capsys, argv, message):
    argv = [a.format(run=runs["classifier"], tmp=tmp_path) for a in argv]
    assert main(["explore", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_gpt_and_translate_refuse_bad_settings(runs, capsys):
    assert main(["explore", str(runs["gpt"]), "To be", "--max-new-tokens", "64"]) == 2
    assert "--max-new-tokens must be in 1..63" in capsys.readouterr().err
    assert main(["explore", str(runs["translate"]), "the", "--beam-size", "0"]) == 2
    assert "--beam-size must be >= 1" in capsys.readouterr().err


def test_json_round_trip_of_float32(runs):
    t = torch.randn(2, 3, 4, 5)
    assert np.array_equal(pack.decode_f32(pack.f32(t), t.shape), t.numpy())
    assert json.loads(json.dumps(pack.f32(t))) == pack.f32(t)
    assert math.isclose(pack.rollout(torch.full((1, 1, 3, 3), 1 / 3)).sum(-1)[0], 1.0)


def test_local_attention_shows_its_window_and_linear_attention_is_refused(tmp_path):
    from explore_runs import classifier_run, gpt_run

    run = gpt_run(tmp_path / "local", attention="local", window=3)
    data = explore_data(load_source(run), ["To be"], max_new_tokens=3)
    (group,) = data["examples"][0]["groups"]
    model = load_source(run).run.model
    tok = load_source(run).run.tokenizer
    ids = torch.tensor([tok.encode("To be" + data["examples"][0]["generation"]["text"])])
    with torch.no_grad():
        x = model.pos_emb(model.tok_emb(ids))
        _, want = model.stack(x, is_causal=True, need_weights=True)
    assert np.abs(_weights(group) - torch.stack(want)[:, 0].numpy()).max() < TOL
    i, j = np.indices((8, 8))
    np.testing.assert_array_equal(_mask(group), (j <= i) & (i - j < 3))  # causal window of 3
    linear = classifier_run(tmp_path / "linear", attention="linear", pooling="mean")
    with pytest.raises(ValueError, match="no softmax attention was recorded"):
        explore_data(load_source(linear), ["好看极了"])


def test_fine_tuned_bert_page_has_prediction_and_cls_rollout(tmp_path):
    from explore_runs import bert_classifier_run

    from attnlab.explore.pack import rollout

    run = bert_classifier_run(tmp_path)
    texts = ["a fine film", "dull and far too long"]
    data = _page(run, tmp_path / "p.html", *texts)
    source = load_source(run)
    assert source.kind == "bert"
    preds = source.run.predict(texts)
    ids, lengths = pad_batch(source.run.tokenizer.encode_batch(texts, 32), 0)
    bert = source.run.model.bert
    with torch.no_grad():
        _, weights = bert.encoder(bert.embeddings(ids), padding_mask(lengths), need_weights=True)
    for b, ex in enumerate(data["examples"]):
        assert ex["prediction"]["label"] == preds[b]["label"]
        (group,) = ex["groups"]
        n = int(lengths[b])
        assert np.abs(_weights(group) - torch.stack(weights)[:, b, :, :n, :n].numpy()).max() < TOL
        n = int(lengths[b])
        share = rollout(torch.stack(weights)[:, b, :, :n, :n])[0]  # the [CLS] row (cls pooling)
        assert ex["token_share"] == pytest.approx((share / share.sum()).tolist(), abs=1e-6)


@pytest.mark.parametrize("mixer", ["rwkv", "mamba", "hybrid"])
def test_rwkv_and_mamba_pages_show_the_mixers_weights(tmp_path, mixer):
    """A GPT without attention layers still gets a page: the mixer's implicit attention."""
    from explore_runs import gpt_run

    extra = {"ffn": "none"} if mixer == "mamba" else {}
    extra = {"attn_every": 2} if mixer == "hybrid" else extra
    run = gpt_run(tmp_path / mixer, mixer=mixer, **extra)
    data = _page(run, tmp_path / "p.html", "To be", extra=("--max-new-tokens", "3"))
    groups = data["examples"][0]["groups"]
    names = [g["name"] for g in groups]
    want = "RWKV time-mix" if mixer == "rwkv" else "Mamba hidden attention"
    assert any(name.startswith(want) for name in names)
    assert ("causal self-attention" in names) == (mixer == "hybrid")
    for group in groups:
        weights = _weights(group)
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        assert group["causal"] and (np.triu(weights, 1) == 0).all()
        _softmax_check(group)
