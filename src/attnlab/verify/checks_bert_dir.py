"""A Chinese BERT checkpoint directory as ``transformers`` writes it (``save_pretrained`` with
safetensors, ``vocab.txt``, ``tokenizer_config.json``), the layout of bert-base-chinese, read
by attnlab's loader: WordPiece ids equal ``BertTokenizer`` and ``BertTokenizerFast`` on Chinese
text (CJK characters split apart, tokenize_chinese_chars), and the encoder's hidden states equal
``transformers.BertModel.from_pretrained`` on the real tokens of a padded batch, float64.

The checkpoint is tiny and random, written here; nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import torch

from attnlab.verify.check import Measure
from attnlab.verify.checks_torch import choice, randint

# Common characters of Chinese reviews: the vocabulary's CJK pieces (others become [UNK]).
CHARS = (
    "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之"
    "年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理"
    "心她本前开但因只从想实日军者意无力它与长把机十民第公此已工使情明性知全三又关点正业外将两高"
    "间由问很最重并物手应战向头文体政美相见被利什二等产或新己制身果加西斯月话合回特代内信表化老"
    "给世位次度门任常先海通教儿原东声提立及比员解水名真论处走义各入几口认条平系气题活尔更别打女"
    "变四神总何电数安少报才结反受目太量再感建务做接必场件计管期市直德资命山金指克许统区保至队形"
    "社便空决治展马科司五基眼书非则听白却界达光放强即像难且权思王象完设式色路记南品住告类求据程"
    "影演剧节紧凑热血沸腾拖沓技言尽段聊局让失望精彩棒差贵便宜快递服质满意值买卖酒店房游戏软件"
)
ENGLISH = ["the", "movie", "good", "##s", "##ly", "bad", "app", "i", "##phone", "5", "##0"]
PUNCT = list("，。！？、：；（）《》“”…!?,.:;()-'\"%") + ["~"]
TEXTS = [
    "这部电影看得我热血沸腾，情节紧凑。",
    "剧情拖沓，演员演技一言难尽。",
    "电影前半段很无聊，但是结局让我感动",
    "iPhone 很好用!!! 5星～ Good movies, BAD apps...",
    "酒店房间干净，服务态度好；价格 ￥350 元。",
    "鼋鼍蛟龙：生僻字都不在词表里",
    "Crème brûlée 很甜 🙂 “不错” 《游戏》",
    "  空格   和\t制表符\n换行  ",
]


def write_tiny_chinese_bert(path: Path, lowercase: bool = False, seed: int = 0) -> Path:
    """A random 2-layer BERT with a Chinese vocab.txt, saved by transformers as safetensors."""
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused1]"]
    pieces = specials + sorted(set(CHARS)) + PUNCT + ENGLISH
    pieces += ["##" + c for c in "影演好"]  # continuation pieces of characters, as in the real one
    (path / "vocab.txt").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lowercase}))
    cfg = transformers.BertConfig(
        vocab_size=len(pieces),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(seed)
    with _quiet(transformers):  # BertForPreTraining: encoder, pooler and both heads, as released
        model = transformers.BertForPreTraining(cfg)
        model.save_pretrained(str(path), safe_serialization=True)
    return path


@contextlib.contextmanager
def _quiet(transformers):
    """Hide transformers' progress bars and load reports (the heads BertModel leaves out)."""
    logging = transformers.utils.logging
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()


def check_chinese_bert_dir(m: Measure) -> None:
    """Token ids (exact) and hidden states (float64) of a random selection of TEXTS."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    from attnlab.data import pad_batch
    from attnlab.models.bert_folder import read_folder

    lowercase = bool(randint(0, 1))
    texts = [choice(TEXTS) for _ in range(randint(2, 6))]
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_chinese_bert(Path(tmp) / "ckpt", lowercase, seed=randint(0, 10_000))
        encoder, _, tokenizer, _ = read_folder(path)
        ours_ids = tokenizer.encode_batch(texts, 64)
        for cls in (transformers.BertTokenizer, transformers.BertTokenizerFast):
            hf_tok = cls.from_pretrained(str(path))
            theirs_ids = [hf_tok(t, truncation=True, max_length=64)["input_ids"] for t in texts]
            if ours_ids != theirs_ids:
                m.fail(f"{cls.__name__} ids differ (lowercase={lowercase}): {texts}")
        with _quiet(transformers):
            hf = transformers.BertModel.from_pretrained(str(path), attn_implementation="eager")
        hf = hf.double().eval()
        ours = encoder.double().eval()
        ids, lengths = pad_batch(ours_ids, tokenizer.pad_id)  # (B, T), (B,)
        real = torch.arange(ids.shape[1])[None] < lengths[:, None]  # (B, T)
        with torch.no_grad():
            got = ours(ids, lengths)  # (B, T, D)
            want = hf(input_ids=ids, attention_mask=real.long()).last_hidden_state
        m.diff(got[real], want[real], "hidden states")
    m.cases += len(texts)
