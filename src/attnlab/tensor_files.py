"""Safetensors files that check themselves on load.

`write_tensors` stores a SHA-256 of the tensors (sorted by name; each name, dtype, shape and raw
bytes) in the file's own string metadata under `CHECKSUM_KEY`, so the file stays one atomic
write. `read_tensors` verifies that checksum when the file has one (files from older runs have
none and still load), and turns every way a file can be bad into a one-line ValueError naming
the file and the fix: missing, truncated or not safetensors, checksum mismatch, NaN/inf values.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from attnlab.compress.int8 import prepare_for_int8_weights
from attnlab.errors import UserError

CHECKSUM_KEY = "attnlab_sha256"


def tensors_sha256(tensors: Mapping[str, Tensor]) -> str:
    """Hex SHA-256 over `tensors` in sorted-name order: name, dtype and shape, then the bytes."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        header = json.dumps([name, str(tensor.dtype), list(tensor.shape)])
        digest.update(header.encode("utf-8") + b"\n")
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def creation_mask() -> int:
    """The process's umask (Linux reports it in /proc; elsewhere it is read by setting it back)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_safetensors(
    tensors: Mapping[str, Tensor], path: str | Path, metadata: Mapping[str, str] | None = None
) -> None:
    """``safetensors.torch.save_file``, leaving the file the mode any new file gets (0666 less
    the umask): safetensors creates it 0600, which a server run as another user cannot read."""
    save_file(dict(tensors), str(path), metadata=dict(metadata) if metadata else None)
    os.chmod(path, 0o666 & ~creation_mask())


def fsync_file(path: Path) -> None:
    """Flush `path` to disk so a rename after it never exposes a half-written file."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_tensors(
    tensors: Mapping[str, Tensor], path: str | Path, metadata: Mapping[str, str] | None = None
) -> Path:
    """Atomically write `tensors` as safetensors (temp file, fsync, rename) with a checksum."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cpu = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    meta = {**(metadata or {}), CHECKSUM_KEY: tensors_sha256(cpu)}
    tmp = path.with_name(path.name + ".tmp")
    try:
        save_safetensors(cpu, tmp, metadata=meta)
        sort_header(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def sort_header(path: Path) -> None:
    """Rewrite a safetensors file's JSON header in place with its keys sorted.

    safetensors writes the header from a hash map, so the same tensors and metadata come out
    in another order from one process to the next; sorted, one model gives one file. The
    header keeps its length (the same compact JSON, reordered), so the data does not move."""
    with open(path, "r+b") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        raw = f.read(size)
        header = json.loads(raw)
        text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        new = text.encode().ljust(size)  # safetensors pads its header with spaces
        if len(new) == size and json.loads(new) == json.loads(raw):
            f.seek(8)
            f.write(new)


def tied_groups(state: Mapping[str, Tensor]) -> list[list[str]]:
    """Names of `state` that are the very same tensor (tied weights), groups of two or more."""
    groups: dict[tuple, list[str]] = {}
    for name, t in state.items():
        if t.numel() == 0:
            continue
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype)
        groups.setdefault(key + (tuple(t.shape), t.stride()), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def model_tensors(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """`model`'s state_dict with tied copies dropped, and {dropped name: kept name}.

    The mapping is the metadata `safetensors.torch.save_model` writes for shared tensors.
    """
    state = dict(model.state_dict())
    dropped: dict[str, str] = {}
    for names in tied_groups(state):
        for name in names[1:]:
            dropped[name] = names[0]
            del state[name]
    return state, dropped


def read_tensors(path: str | Path, what: str = "weights") -> dict[str, Tensor]:
    """All tensors of a safetensors file on the CPU, checked; `what` names the file's role."""
    path = Path(path)
    fix = f"retrain or restore the {what} file"
    if not path.is_file():
        raise UserError(f"{path}: no such {what} file; check the path or retrain")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            names = list(f.keys())  # a safe_open handle is not iterable
            tensors = {name: f.get_tensor(name) for name in names}
    except (SafetensorError, OSError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise UserError(f"{path}: truncated or not a safetensors file ({reason}); {fix}") from None
    expected = metadata.get(CHECKSUM_KEY)
    if expected is not None and tensors_sha256(tensors) != expected:
        raise UserError(
            f"{path}: corrupt: its tensors do not match the checksum stored in the file; {fix}"
        )
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not all_finite(tensor):
            raise UserError(
                f"{path}: tensor {name!r} holds non-finite values (NaN or inf); the training "
                f"diverged or the file is corrupt; {fix} (e.g. with a lower --lr)"
            )
    return tensors


def all_finite(tensor: Tensor) -> bool:
    """Whether every element is finite. A NaN or an inf makes the sum NaN or inf, so a finite
    sum settles it in one fast reduction; only a non-finite sum (which finite values can also
    reach by overflow) is checked element by element."""
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


def load_tensors_into(model: nn.Module, tensors: Mapping[str, Tensor], path: str | Path) -> None:
    """Copy `tensors` into `model` strictly (tied names may be stored once); one-line errors."""
    tensors = dict(tensors)
    prepare_for_int8_weights(model, set(tensors))  # an `attnlab quantize` run: int8 layers
    own = model.state_dict()
    unexpected = sorted(set(tensors) - set(own))
    missing = set(own) - set(tensors)
    for names in tied_groups(own):
        if any(name in tensors for name in names):
            missing -= set(names)
    mismatched = [
        f"{name} {tuple(tensors[name].shape)} in the file vs {tuple(own[name].shape)} in the model"
        for name in sorted(set(tensors) & set(own))
        if tensors[name].shape != own[name].shape
    ]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(sorted(missing))}")
    if unexpected:
        problems.append(f"unexpected {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatch: {'; '.join(mismatched)}")
    if problems:
        raise UserError(
            f"{path}: weights do not fit this {type(model).__name__} ({'; '.join(problems)}); "
            "load it with the config it was trained with"
        )
    model.load_state_dict(dict(tensors), strict=False)
