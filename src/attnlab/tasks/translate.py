"""Translation end to end: pairs, tokenizers, encoder-decoder training, decoding, BLEU/chrF.

A run directory holds: config.json (task "translate"), src_tokenizer.json and
tgt_tokenizer.json (one file, tokenizer.json, when the vocabulary is shared),
data_report.json, model.safetensors (best by validation loss), metrics.jsonl, state/ (exact
resume), results.json and test.hyp.txt (the test split's translations, one a line).
"""

from __future__ import annotations

import json
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from attnlab.configs import ConfigBase, setting
from attnlab.data.io import write_json
from attnlab.data.parallel import (
    SPECIALS,
    Pair,
    ParallelData,
    TextTokenizer,
    read_pairs,
    split_pairs,
    synthetic_pairs,
)
from attnlab.errors import UserError
from attnlab.infer.beam import DecodeSettings, beam_search, greedy_decode
from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from attnlab.models.t5 import T5Translator, check_translator, translator
from attnlab.runs import training
from attnlab.runs.folder import WEIGHTS
from attnlab.runs.task import Run, RunConfig, Setup, Task
from attnlab.train import StepOutput, TrainConfig, load_weights

BUNDLED = Path(__file__).resolve().parent.parent / "data" / "bible.tsv.gz"
LANGS = ("en", "de", "zh")
SubwordKind = Literal["bpe", "unigram", "char"]


@dataclass
class TranslateDataConfig(ConfigBase):
    """Corpus, tokenizer, batching and decoding options of the translation task."""

    data: str = setting("", "TSV (src<TAB>tgt[<TAB>group]) or JSONL pairs; empty = Bible")
    pair: str = setting("en-de", "bundled Bible: en-de, de-en, en-zh, ...")
    synthetic: Literal["", "copy", "reverse"] = setting("", "copy | reverse: random letter strings")
    synthetic_size: int = setting(6000, "pairs of the synthetic task", min=1)
    tokenizer: SubwordKind = setting("bpe", "bpe | unigram | char (source side)")
    tgt_tokenizer: Literal["", SubwordKind] = setting("", "target side; empty = tokenizer")
    vocab_size: int = setting(8000, "subword vocabulary per tokenizer", min=1)
    tgt_tokenizer_size: int = setting(0, "target vocabulary when not shared; 0 = vocab_size", min=0)
    max_sentence_tokens: int = setting(100, "longer training pairs are dropped", min=1)
    max_tokens: int = setting(4096, "padded tokens per batch (budget)", min=1)
    dev_percent: float = setting(2.0, "share of groups in dev")
    test_percent: float = setting(2.0, "share of groups in test")
    label_smoothing: float = setting(0.1, min=0, below=1)
    beam_size: int = setting(4, "1 = greedy", min=1)
    length_penalty: float = setting(0.6, "GNMT alpha")
    max_len_a: float = setting(1.5, "max output = a·|src| + b tokens")
    max_len_b: int = setting(10)
    eval_batch_sentences: int = setting(64, min=1)

    def check(self) -> None:
        src, _, tgt = self.pair.partition("-")
        if src not in LANGS or tgt not in LANGS or src == tgt:
            raise UserError(f"pair must be two of {', '.join(LANGS)} like en-de, got {self.pair}")
        if self.max_tokens < self.max_sentence_tokens + 1:
            raise UserError("max_tokens must exceed max_sentence_tokens (a batch holds a pair)")
        for name in ("vocab_size", "tgt_tokenizer_size"):
            size = getattr(self, name)
            if 0 < size <= len(SPECIALS):  # tgt_tokenizer_size 0: the same as vocab_size
                raise UserError(
                    f"{name} {size} is too small: every vocabulary holds the {len(SPECIALS)} "
                    f"special tokens ({' '.join(SPECIALS)}) and at least one more; give "
                    f"{len(SPECIALS) + 1} or more"
                )


SECTIONS: dict[str, type[ConfigBase]] = {
    "data": TranslateDataConfig,
    "model": Seq2SeqConfig,
    "train": TrainConfig,
}


def build_config(preset: str | Path | None, overrides: dict[str, Any]) -> RunConfig:
    """Defaults <- presets/translate.toml <- a preset (file or bundled name) <- fields."""
    return training.build_config(TASK, preset, overrides)


# ---------------------------------------------------------------------------- data


def load_pairs(dcfg: TranslateDataConfig, seed: int) -> list[Pair]:
    """The run's sentence pairs: synthetic, a user file, or the bundled verse-aligned Bible."""
    if dcfg.synthetic:
        return synthetic_pairs(dcfg.synthetic, dcfg.synthetic_size, seed)
    if dcfg.data:
        return read_pairs(dcfg.data)
    import csv
    import gzip

    src, tgt = dcfg.pair.split("-")
    with gzip.open(BUNDLED, "rt", encoding="utf-8") as f:
        rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        # group = book and chapter ("Gen 1:3" -> "Gen 1"): whole chapters share a split
        return [Pair(r[src], r[tgt], r["ref"].rsplit(":", 1)[0]) for r in rows]


@dataclass
class Prepared:
    """Tokenizers and the split pairs of a run."""

    src_tok: TextTokenizer
    tgt_tok: TextTokenizer
    splits: dict[str, list[Pair]]
    report: dict[str, Any]


def tokenizer_paths(run_dir: Path, shared: bool) -> tuple[Path, Path]:
    if shared:
        return run_dir / "tokenizer.json", run_dir / "tokenizer.json"
    return run_dir / "src_tokenizer.json", run_dir / "tgt_tokenizer.json"


def prepare(cfg: RunConfig, run_dir: Path, resume: bool) -> Prepared:
    """Split the pairs and train (or, on resume, reload) the tokenizers on the training side."""
    d, shared = cfg.data, cfg.model.shared_embeddings
    splits = split_pairs(load_pairs(d, cfg.train.seed), d.dev_percent, d.test_percent)
    src_path, tgt_path = tokenizer_paths(run_dir, shared)
    tgt_kind = d.tgt_tokenizer or d.tokenizer
    if shared and tgt_kind != d.tokenizer:
        raise UserError("a shared vocabulary needs one tokenizer: set shared_embeddings=false")
    if shared and d.tgt_tokenizer_size not in (0, d.vocab_size):
        raise UserError(
            "a shared vocabulary has one size (vocab_size): set shared_embeddings=false"
        )
    if resume and src_path.exists() and tgt_path.exists():
        src_tok, tgt_tok = TextTokenizer.load(src_path), TextTokenizer.load(tgt_path)
    else:
        train = splits["train"]
        if shared:
            texts = [p.src for p in train] + [p.tgt for p in train]
            src_tok = tgt_tok = TextTokenizer.train(texts, d.tokenizer, d.vocab_size)
        else:
            src_tok = TextTokenizer.train([p.src for p in train], d.tokenizer, d.vocab_size)
            tgt_size = d.tgt_tokenizer_size or d.vocab_size
            tgt_tok = TextTokenizer.train([p.tgt for p in train], tgt_kind, tgt_size)
        run_dir.mkdir(parents=True, exist_ok=True)
        src_tok.save(src_path)
        tgt_tok.save(tgt_path)
    report = {
        "source": d.synthetic or d.data or f"bundled Bible {d.pair} ({BUNDLED.name})",
        "pairs": {name: len(part) for name, part in splits.items()},
        "vocab": {"src": src_tok.vocab_size, "tgt": tgt_tok.vocab_size, "shared": shared},
        "split": f"by group (book and chapter), dev {d.dev_percent}%, test {d.test_percent}%",
    }
    return Prepared(src_tok, tgt_tok, splits, report)


def encode_split(
    pairs: list[Pair], prep: Prepared, max_len: int | None
) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of a split; pairs longer than ``max_len`` (either side) are dropped."""
    src, tgt = [], []
    for p in pairs:
        s, t = prep.src_tok.encode(p.src), prep.tgt_tok.encode(p.tgt)
        if s and t and (max_len is None or (len(s) <= max_len and len(t) + 1 <= max_len)):
            src.append(s)
            tgt.append(t)
    return src, tgt


# ---------------------------------------------------------------------------- train


def step_fn(label_smoothing: float):
    """Cross-entropy of the shifted targets (teacher forcing), label-smoothed (§5.4)."""

    def step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> StepOutput:
        logits = model(batch["src"], batch["tgt_in"])  # (B, T, V)
        target = batch["tgt_out"]  # (B, T), 0 = pad
        loss = F.cross_entropy(
            logits.flatten(0, 1).float(),
            target.flatten(),
            ignore_index=0,
            label_smoothing=label_smoothing,
        )
        return StepOutput(loss=loss, weight=int((target != 0).sum()))

    return step


@torch.no_grad()
def mean_nll(model: Seq2SeqTransformer, data: ParallelData, device: str) -> float:
    """Mean target-token negative log-likelihood (nats) over a split, no smoothing."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for idx in data.batches(0):
        b = {k: v.to(device) for k, v in data.collate(idx).items()}
        logits = model(b["src"], b["tgt_in"]).float()
        total += F.cross_entropy(
            logits.flatten(0, 1), b["tgt_out"].flatten(), ignore_index=0, reduction="sum"
        ).item()
        count += int((b["tgt_out"] != 0).sum())
    model.train(was)
    return total / count


class TranslateTask(Task):
    """Sequence-to-sequence translation with an encoder-decoder Transformer."""

    name = "translate"
    # seq2seq: Vaswani et al.; t5 (models/t5.py): relative bias, RMSNorm, needs
    # shared_embeddings and activation relu or geglu_tanh, ignores norm, pos, tie_weights
    archs = ("seq2seq", "t5")
    preset = "translate"
    preset_prefix = "translate"
    resumable = frozenset({"beam_size", "length_penalty", "eval_batch_sentences"})
    data_paths = ("data",)

    def sections(self) -> dict[str, type[ConfigBase]]:
        return SECTIONS

    def check(self, cfg: RunConfig) -> None:
        check_translator(cfg.arch, cfg.model)

    def setup(self, cfg: RunConfig, run_dir: Path, resume: bool, device: str) -> Setup:
        prep = prepare(cfg, run_dir, resume)
        cfg.model.src_vocab_size = prep.src_tok.vocab_size
        cfg.model.tgt_vocab_size = prep.tgt_tok.vocab_size
        d = cfg.data
        train_ids = encode_split(prep.splits["train"], prep, d.max_sentence_tokens)
        dev_ids = encode_split(prep.splits["dev"], prep, None)
        prep.report["train_pairs_used"] = len(train_ids[0])
        train_data = ParallelData(*train_ids, d.max_tokens, cfg.train.seed)
        longest = max(max(len(s), len(t) + 1) for s, t in zip(*dev_ids))
        dev_data = ParallelData(*dev_ids, max(d.max_tokens, longest), shuffle=False)

        def evaluate(net: torch.nn.Module) -> dict[str, float]:
            return {"val_loss": mean_nll(net, dev_data, device)}  # type: ignore[arg-type]

        files = {"data_report.json": lambda path: write_json(path, prep.report)}
        message = f"data: {json.dumps(prep.report, ensure_ascii=False)}"
        return Setup(prep, train_data, evaluate, files, [message])

    def build_model(self, cfg: RunConfig, setup: Setup) -> Seq2SeqTransformer:
        model, m = translator(cfg.arch, cfg.model), cfg.model
        setup.messages.append(
            f"model: {'T5, ' if isinstance(model, T5Translator) else ''}"
            f"{model.num_params() / 1e6:.2f}M parameters; {m.n_encoder_layers}+"
            f"{m.n_decoder_layers} layers, {m.n_heads} heads, d_model {m.d_model}, d_ff {m.d_ff}"
        )
        return model

    def step(self, cfg: RunConfig):
        return step_fn(cfg.data.label_smoothing)

    def finish(
        self, cfg: RunConfig, setup: Setup, model: Seq2SeqTransformer, run_dir: Path, device: str
    ) -> dict[str, Any]:
        prep: Prepared = setup.prepared
        run = TranslatorRun(run_dir, cfg, prep.src_tok, prep.tgt_tok, model, device)
        test = run.evaluate(split="test", pairs=prep.splits["test"])
        return {"n_params": model.num_params(), "data": prep.report, "test": test}

    def describe(self, results: Mapping[str, Any], run_dir: Path) -> list[str]:
        return [format_scores(results["test"])]

    def load(self, run_dir: Path, cfg: RunConfig, device: str) -> TranslatorRun:
        src_path, tgt_path = tokenizer_paths(run_dir, cfg.model.shared_embeddings)
        model = translator(cfg.arch, cfg.model)
        load_weights(model, run_dir / WEIGHTS)
        model.to(device).eval()
        src_tok, tgt_tok = TextTokenizer.load(src_path), TextTokenizer.load(tgt_path)
        for path, tok, size in (
            (src_path, src_tok, cfg.model.src_vocab_size),
            (tgt_path, tgt_tok, cfg.model.tgt_vocab_size),
        ):
            if tok.vocab_size != size:  # ids past the embedding table: an IndexError later
                raise UserError(
                    f"{path}: the tokenizer has {tok.vocab_size} tokens but the model was "
                    f"trained on {size}; it belongs to another run: restore it, or retrain"
                )
        return TranslatorRun(run_dir, cfg, src_tok, tgt_tok, model, device)


def format_scores(report: Mapping[str, Any]) -> str:
    """One line: split, sentences, beam, BLEU, chrF and exact match."""
    bleu = "BLEU n/a" if report["bleu"] is None else f"BLEU {report['bleu']:.2f}"
    line = (
        f"{report['split']} ({report['n']} sentences, beam {report['beam_size']}): "
        f"{bleu}, chrF {report['chrf']:.2f}, exact match {report['exact_match']:.4f}"
    )
    return line + (f" ({report['bleu_note']})" if report.get("bleu_note") else "")


UNK_ID = 3  # <unk> of every TextTokenizer (<pad> <s> </s> <unk> = 0..3)


# ---------------------------------------------------------------------------- use a run


def run_pairs(cfg: RunConfig, split: str) -> list[Pair]:
    """The pairs of one split of a run, rebuilt from its config (the split is deterministic)."""
    d = cfg.data
    return split_pairs(load_pairs(d, cfg.train.seed), d.dev_percent, d.test_percent)[split]


def bleu_tokenize(d: TranslateDataConfig) -> str:
    """sacreBLEU's tokenizer for a run's target side: `zh` for the bundled Chinese, else 13a."""
    return "zh" if d.pair.endswith("-zh") and not d.data and not d.synthetic else "13a"


class TranslatorRun(Run):
    """A trained run: its config, tokenizers and model, ready to translate and evaluate."""

    verbs = ("translate", "evaluate")
    explore_page = "translate"

    def __init__(
        self,
        run_dir: Path,
        cfg: RunConfig,
        src_tok: TextTokenizer,
        tgt_tok: TextTokenizer,
        model: Seq2SeqTransformer,
        device: str,
    ) -> None:
        super().__init__(run_dir, cfg)
        self.cfg, self.device = cfg, device
        self.src_tok, self.tgt_tok, self.model = src_tok, tgt_tok, model

    @classmethod
    def load(cls, run_dir: str | Path, device: str = "cpu") -> TranslatorRun:
        from attnlab.runs.load import load_run_of

        run = load_run_of(run_dir, cls, "a translation run", device)
        return run  # type: ignore[return-value]

    def report_text(self, report: Mapping[str, Any]) -> str:
        return format_scores(report)

    def unknown(self, texts: list[str]) -> list[tuple[int, int, int]]:
        """(input number, unknown tokens, tokens) of each input with tokens outside the
        source vocabulary: their translation is a guess."""
        out = []
        for i, text in enumerate(texts, start=1):
            ids = self.src_tok.encode(text)
            n_unk = sum(t == UNK_ID for t in ids)
            if n_unk:
                out.append((i, n_unk, len(ids)))
        return out

    def translate(self, texts: list[str], beam_size: int | None = None) -> list[str]:
        """Translate sentences (beam search, or greedy with beam_size 1), in batches."""
        d = self.cfg.data
        beam = d.beam_size if beam_size is None else beam_size
        settings = DecodeSettings(1, 2, d.max_len_a, d.max_len_b)
        limit = self.cfg.model.context if self.cfg.model.pos == "learned" else 10_000
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths
        hyps: dict[int, str] = {}
        for start in range(0, len(order), d.eval_batch_sentences):
            chunk = order[start : start + d.eval_batch_sentences]
            ids = [self.src_tok.encode(texts[i])[:limit] or [3] for i in chunk]
            src = torch.zeros(len(ids), max(map(len, ids)), dtype=torch.long)
            for row, seq in enumerate(ids):
                src[row, : len(seq)] = torch.tensor(seq)
            src = src.to(self.device)
            if beam == 1:
                decoded = greedy_decode(self.model, src, settings)
            else:
                decoded = beam_search(self.model, src, settings, beam, d.length_penalty)
            for i, seq in zip(chunk, decoded):
                hyps[i] = self.tgt_tok.decode(seq)
        return [hyps[i] for i in range(len(texts))]

    def evaluate(
        self,
        data: str | None = None,
        split: str = "test",
        pairs: list[Pair] | None = None,
        beam_size: int | None = None,
    ) -> dict[str, Any]:
        """sacreBLEU and chrF (and exact match) on a split of the run (``val`` = dev), on a
        file of pairs (``data``) or on ``pairs``; writes ``{split}.hyp.txt``.

        Both sides are scored after the tokenizers' NFKC normalisation (see below)."""
        import sacrebleu

        split = {"val": "dev"}.get(split, split)
        if data is not None:
            pairs, split = read_pairs(data), Path(data).stem
        elif pairs is None:
            pairs = run_pairs(self.cfg, split)
        start = time.perf_counter()
        hyps = self.translate([p.src for p in pairs], beam_size)
        seconds = time.perf_counter() - start
        # The tokenizers NFKC-normalise text (full-width ，； become ,;), so a model can only
        # ever write the normalised form: score hypotheses and references in that form.
        hyps = [unicodedata.normalize("NFKC", h) for h in hyps]
        refs = [unicodedata.normalize("NFKC", p.tgt) for p in pairs]
        bleu_metric, chrf_metric = (
            sacrebleu.BLEU(tokenize=bleu_tokenize(self.cfg.data)),
            sacrebleu.CHRF(),
        )
        bleu = bleu_metric.corpus_score(hyps, [refs])
        no_4grams = bleu.totals[3] == 0  # every hypothesis shorter than 4 tokens
        chrf = chrf_metric.corpus_score(hyps, [refs])
        (self.run_dir / f"{split}.hyp.txt").write_text("".join(h + "\n" for h in hyps))
        return {
            "split": split,
            "n": len(pairs),
            "bleu": None if no_4grams else round(bleu.score, 2),
            "bleu_note": (
                "BLEU is undefined here: it counts 4-grams and no line has 4 tokens; "
                "read chrF and exact match"
                if no_4grams
                else ""
            ),
            "chrf": round(chrf.score, 2),
            "exact_match": sum(h == r for h, r in zip(hyps, refs)) / len(refs),
            "beam_size": self.cfg.data.beam_size if beam_size is None else beam_size,
            "signatures": [str(bleu_metric.get_signature()), str(chrf_metric.get_signature())],
            "decode_seconds": round(seconds, 2),
            "hypotheses": f"{split}.hyp.txt",
            "examples": [
                {"src": p.src, "ref": p.tgt, "hyp": h} for p, h in list(zip(pairs, hyps))[:3]
            ],
        }


TASK = TranslateTask()
