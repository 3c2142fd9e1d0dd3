"""Text-classification data: corpora, user files, splits, character tokenizer, batching."""

from attnlab.data.buckets import (
    LengthBucketSampler,
    pad_batch,
    padding_fraction,
    shuffled_batches,
)
from attnlab.data.char_tokenizer import CharTokenizer
from attnlab.data.classification import ClassificationData
from attnlab.data.corpora import load_chinese_reviews
from attnlab.data.corpus import LabeledCorpus
from attnlab.data.errors import DataError
from attnlab.data.labels import MIN_CLASS_EXAMPLES, LabelVocab, check_label_counts
from attnlab.data.lengths import TruncationReport, choose_max_len, truncation_report
from attnlab.data.splits import (
    check_labels,
    load_split,
    load_split_files,
    save_split,
    stratified_split,
)
from attnlab.data.tabular import load_labeled_file

__all__ = [
    "MIN_CLASS_EXAMPLES",
    "CharTokenizer",
    "ClassificationData",
    "DataError",
    "LabelVocab",
    "LabeledCorpus",
    "LengthBucketSampler",
    "TruncationReport",
    "check_label_counts",
    "check_labels",
    "choose_max_len",
    "load_chinese_reviews",
    "load_labeled_file",
    "load_split",
    "load_split_files",
    "pad_batch",
    "padding_fraction",
    "save_split",
    "shuffled_batches",
    "stratified_split",
    "truncation_report",
]
