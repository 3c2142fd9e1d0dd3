"""The image sets of the vision and MAE tasks: which images, how they are split and batched.

``VisionConfig`` is the data section both tasks read; ``load_splits`` gives the train, val and
test images (Fashion-MNIST, MNIST, an idx pair or a folder of class sub-folders, validation and
test carved out by a stratified split when not given); ``image_data`` the data report and the
normalised, augmented training and validation batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from attnlab.configs import ConfigBase, setting
from attnlab.data.images import (
    ImageData,
    ImageSet,
    channel_stats,
    load_fashion_mnist,
    load_idx_pair,
    load_image_folder,
    load_mnist,
)
from attnlab.data.labels import check_label_counts
from attnlab.data.splits import stratified_split
from attnlab.errors import UserError


@dataclass
class VisionConfig(ConfigBase):
    """Which images, how they are split and augmented, and the loss options."""

    dataset: Literal["fashion-mnist", "mnist", "folder", "idx"] = setting(
        "fashion-mnist", "fashion-mnist, mnist, folder or idx"
    )
    data: str = setting("", "folder: ROOT/<class>/*.png; idx: images")
    labels: str = setting("", "idx: the labels file of --data")
    test_data: str = setting("", "idx images / folder for testing")
    test_labels: str = setting("", "idx: labels of --test-data")
    channels: int = setting(0, "folder: 1 grey, 3 RGB; 0 = 3", min=0)
    resize: int = setting(0, "folder: resize images to N × N; 0 = keep", min=0)
    val_ratio: float = setting(0.1, "validation share of the train set")
    test_ratio: float = setting(0.1, "test share when no test set given")
    split_seed: int = setting(0)
    max_train: int = setting(0, "use at most N training images; 0 = all", min=0)
    crop_padding: int = setting(2, "random crop after zero padding by N", min=0)
    hflip: bool = setting(True, "random horizontal flips")
    label_smoothing: float = setting(0.1, min=0, below=1)
    teacher: str = setting("", "deit: the run folder of the teacher (e.g. a CNN+SE run)")
    init: str = setting("", "vit: start from the encoder of this MAE run (fine-tune)")
    eval_batch_size: int = setting(500, min=1)
    allow_rare_labels: bool = setting(
        False, "train even with classes of fewer than 5 training examples"
    )


def load_splits(dcfg: VisionConfig) -> tuple[dict[str, ImageSet], str]:
    """train/val/test ImageSets and a description; val (and test if none given) are carved
    out of the training images by a stratified split seeded by ``split_seed``."""
    test: ImageSet | None = None
    if dcfg.dataset == "fashion-mnist":
        full, test = load_fashion_mnist("train"), load_fashion_mnist("test")
    elif dcfg.dataset == "mnist":
        full, test = load_mnist("train"), load_mnist("test")
    elif dcfg.dataset == "idx":
        if not (dcfg.data and dcfg.labels):
            raise UserError("dataset=idx needs --data IMAGES.idx and --labels LABELS.idx")
        full = load_idx_pair(dcfg.data, dcfg.labels)
        if dcfg.test_data:
            if not dcfg.test_labels:
                raise UserError("--test-data with dataset=idx needs --test-labels as well")
            test = load_idx_pair(dcfg.test_data, dcfg.test_labels, full.classes)
    elif dcfg.dataset == "folder":
        if not dcfg.data:
            raise UserError("dataset=folder needs --data ROOT (one sub-folder per class)")
        channels = dcfg.channels or 3
        full = load_image_folder(dcfg.data, channels, dcfg.resize)
        if dcfg.test_data:
            test = load_image_folder(dcfg.test_data, channels, dcfg.resize or full.images.shape[-1])
            if test.classes != full.classes:
                raise UserError(
                    f"test classes {test.classes} differ from train classes {full.classes}"
                )
    else:
        raise UserError(
            f"dataset must be fashion-mnist, mnist, folder or idx; got {dcfg.dataset!r}"
        )
    labels = [str(int(y)) for y in full.labels]
    test_ratio = 0.0 if test is not None else dcfg.test_ratio
    split = stratified_split(
        labels, (1 - dcfg.val_ratio - test_ratio, dcfg.val_ratio, test_ratio), dcfg.split_seed
    )
    train_idx = split["train"]
    check_label_counts([labels[i] for i in train_idx], dcfg.allow_rare_labels)
    if dcfg.max_train:
        g = torch.Generator().manual_seed(dcfg.split_seed)
        keep = torch.randperm(len(train_idx), generator=g)[: dcfg.max_train].sort().values
        train_idx = [train_idx[i] for i in keep.tolist()]
    out = {"train": full.subset(train_idx), "val": full.subset(split["val"])}
    out["test"] = test if test is not None else full.subset(split["test"])
    if not len(out["val"]):
        raise UserError("the validation split is empty; set val_ratio > 0")
    return out, full.source


def image_data(
    cfg: Any, splits: dict[str, Any], source: str
) -> tuple[dict[str, Any], ImageData, ImageData]:
    """The data report (source, classes, shape, channel mean/std, split sizes) and the training
    and validation batches, normalised by the training split's channel statistics."""
    train_set = splits["train"]
    mean, std = channel_stats(train_set.images)
    report = {
        "source": source,
        "classes": train_set.classes,
        "image_shape": list(train_set.images.shape[1:]),
        "mean": mean,
        "std": std,
        "split_sizes": {k: len(v) for k, v in splits.items()},
    }
    dcfg = cfg.data
    train_data = ImageData(
        train_set, mean, std, cfg.train.batch_size, True, cfg.train.seed,
        dcfg.crop_padding, dcfg.hflip,
    )  # fmt: skip
    val_data = ImageData(splits["val"], mean, std, dcfg.eval_batch_size)
    return report, train_data, val_data
