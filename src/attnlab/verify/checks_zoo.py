"""Parity of the model zoo (T5, ELECTRA, ALBERT, DeBERTa-v2) against Hugging Face classes.

Each check builds a tiny random HF model, scrambles its weights, copies every tensor into
attnlab's model through a list of :class:`ZLink` (which must cover every attnlab parameter),
runs both on a right-padded batch and compares the outputs on real tokens and every parameter
gradient (a random cotangent on the real positions). T5 and ELECTRA/ALBERT/DeBERTa compute in
float64 (HF's T5 norm, which takes its variance in float32 whatever the input, is run with the
variance in float64 for the comparison).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.verify.check import Measure
from attnlab.verify.checks_hf import _transformers, backward_both, scramble
from attnlab.verify.checks_torch import choice, randint
from attnlab.verify.copy_weights import Link, _cat, _covers, copy_links

F64 = torch.float64


@dataclass
class ZLink(Link):
    """A :class:`Link` whose gradient combines differently from its value (``grad_join``):
    a weight stored as c·W has gradient (1/c)·dL/dW."""

    grad_join: Callable[..., Tensor] | None = None


def grad_error(links: Sequence[Link]) -> float:
    """Largest |attnlab gradient − the reference gradients combined| over all links."""
    worst = 0.0
    for link in links:
        if link.ours.grad is None:
            raise ValueError(f"no gradient for {link.name}")
        join = getattr(link, "grad_join", None) or link.join
        grads = []
        for t in link.theirs:
            grads.append(torch.zeros_like(t) if t.grad is None else t.grad)
        worst = max(worst, (link.ours.grad - join(*grads)).abs().max().item())
    return worst


def _lin(ours: nn.Linear, theirs: nn.Linear, name: str) -> list[Link]:
    links = [Link(ours.weight, (theirs.weight,), name=f"{name}.weight")]
    if ours.bias is not None:
        links.append(Link(ours.bias, (theirs.bias,), name=f"{name}.bias"))
    return links


def _norm(ours: nn.Module, theirs: nn.Module, name: str) -> list[Link]:
    links = [Link(ours.weight, (theirs.weight,), name=f"{name}.weight")]
    if getattr(ours, "bias", None) is not None:
        links.append(Link(ours.bias, (theirs.bias,), name=f"{name}.bias"))
    return links


def _padded_batch(vocab: int, B: int = 0, pad: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """ids (B, T) right-padded with ``pad``, lengths (B,), real (B, T) bool; row 0 is full."""
    B, T = B or randint(1, 4), randint(2, 14)
    lengths = torch.randint(1, T + 1, (B,))
    lengths[0] = T
    real = torch.arange(T)[None] < lengths[:, None]
    ids = torch.randint(1, vocab, (B, T)).masked_fill(~real, pad)
    return ids, lengths, real


# --------------------------------------------------------------------------- T5


def t5_attention_links(ours: nn.Module, theirs: nn.Module, name: str) -> list[Link]:
    """T5Attention -> MultiHeadAttention(bias=False): q_proj = √d_k·q, kv_proj = [k; v],
    out_proj = o."""
    c = theirs.key_value_proj_dim**0.5
    q = ZLink(
        ours.q_proj.weight,
        (theirs.q.weight,),
        lambda w: w * c,
        f"{name}.q",
        grad_join=lambda g: g / c,
    )
    kv = Link(ours.kv_proj.weight, (theirs.k.weight, theirs.v.weight), _cat, f"{name}.kv")
    return [q, kv, Link(ours.out_proj.weight, (theirs.o.weight,), name=f"{name}.o")]


def t5_ff_links(ours: nn.Module, theirs: nn.Module, name: str) -> list[Link]:
    """T5DenseActDense (wi, wo) or T5DenseGatedActDense (w_in = [wi_0; wi_1], wo)."""
    if hasattr(theirs, "wi_0"):
        w_in = Link(ours.w_in.weight, (theirs.wi_0.weight, theirs.wi_1.weight), _cat, name)
    else:
        w_in = Link(ours.w_in.weight, (theirs.wi.weight,), name=f"{name}.wi")
    return [w_in, Link(ours.w_out.weight, (theirs.wo.weight,), name=f"{name}.wo")]


def t5_links(ours: nn.Module, theirs: nn.Module) -> list[Link]:
    """T5ForConditionalGeneration / T5Model -> attnlab's T5, every parameter."""
    links = [Link(ours.shared.weight, (theirs.shared.weight,), name="shared")]
    enc, dec = theirs.encoder, theirs.decoder
    links.append(
        Link(
            ours.encoder_bias.embedding.weight,
            (enc.block[0].layer[0].SelfAttention.relative_attention_bias.weight,),
            name="encoder relative bias",
        )
    )
    links.append(
        Link(
            ours.decoder_bias.embedding.weight,
            (dec.block[0].layer[0].SelfAttention.relative_attention_bias.weight,),
            name="decoder relative bias",
        )
    )
    for i, (mine, ref) in enumerate(zip(ours.encoder.blocks, enc.block, strict=True)):
        links += t5_attention_links(mine.self_attn, ref.layer[0].SelfAttention, f"enc{i}.attn")
        links += _norm(mine.norm1, ref.layer[0].layer_norm, f"enc{i}.norm1")
        links += t5_ff_links(mine.ff, ref.layer[1].DenseReluDense, f"enc{i}.ff")
        links += _norm(mine.norm2, ref.layer[1].layer_norm, f"enc{i}.norm2")
    for i, (mine, ref) in enumerate(zip(ours.decoder.blocks, dec.block, strict=True)):
        links += t5_attention_links(mine.self_attn, ref.layer[0].SelfAttention, f"dec{i}.attn")
        links += _norm(mine.norm1, ref.layer[0].layer_norm, f"dec{i}.norm1")
        links += t5_attention_links(mine.cross_attn, ref.layer[1].EncDecAttention, f"dec{i}.x")
        links += _norm(mine.norm2, ref.layer[1].layer_norm, f"dec{i}.norm2")
        links += t5_ff_links(mine.ff, ref.layer[2].DenseReluDense, f"dec{i}.ff")
        links += _norm(mine.norm3, ref.layer[2].layer_norm, f"dec{i}.norm3")
    links += _norm(ours.encoder.norm, enc.final_layer_norm, "encoder.final_layer_norm")
    links += _norm(ours.decoder.norm, dec.final_layer_norm, "decoder.final_layer_norm")
    return _covers(ours, links)


@contextmanager
def t5_norm_in_input_dtype() -> Iterator[None]:
    """HF's T5LayerNorm takes its variance in float32 even for float64 inputs; while active it
    keeps the input's dtype (the same formula), so that a float64 comparison is exact."""
    from transformers.models.t5 import modeling_t5

    def forward(self: nn.Module, h: Tensor) -> Tensor:
        variance = h.pow(2).mean(-1, keepdim=True)
        return self.weight * (h * torch.rsqrt(variance + self.variance_epsilon))

    original = modeling_t5.T5LayerNorm.forward
    modeling_t5.T5LayerNorm.forward = forward
    try:
        yield
    finally:
        modeling_t5.T5LayerNorm.forward = original


def check_t5(m: Measure, cases: int = 4) -> None:
    """T5ForConditionalGeneration (v1.0 relu with scaled output, v1.1 gated-gelu without) ==
    attnlab's T5: encoder states and logits on real tokens of right-padded source and target
    batches, and every parameter gradient; float64 (HF's norm variance kept in float64:
    :func:`t5_norm_in_input_dtype`)."""
    with t5_norm_in_input_dtype():
        _check_t5(m, cases)


def _check_t5(m: Measure, cases: int) -> None:
    from attnlab.models.t5 import T5, T5Config

    tf = _transformers()
    for i in range(cases):
        v11 = i % 2 == 1
        H, dk = randint(1, 4), randint(2, 6)
        buckets = randint(4, 16)
        hf_cfg = tf.T5Config(
            vocab_size=randint(20, 60),
            d_model=H * dk,
            d_kv=dk,
            d_ff=randint(8, 40),
            num_layers=randint(1, 3),
            num_decoder_layers=randint(1, 3),
            num_heads=H,
            relative_attention_num_buckets=buckets,
            relative_attention_max_distance=randint(buckets // 2 + 1, 40),
            dropout_rate=0.0,
            feed_forward_proj="gated-gelu" if v11 else "relu",
            tie_word_embeddings=not v11,
        )
        hf_cfg._attn_implementation = "eager"
        hf = scramble(tf.T5ForConditionalGeneration(hf_cfg), 0.3).double().eval()
        cfg = T5Config(
            vocab_size=hf_cfg.vocab_size,
            d_model=hf_cfg.d_model,
            n_heads=H,
            d_ff=hf_cfg.d_ff,
            n_layers=hf_cfg.num_layers,
            n_decoder_layers=hf_cfg.num_decoder_layers,
            num_buckets=buckets,
            max_distance=hf_cfg.relative_attention_max_distance,
            activation="geglu_tanh" if v11 else "relu",
            scale_output=not v11,
            norm_eps=hf_cfg.layer_norm_epsilon,
            dropout=0.0,
        )
        ours = T5(cfg).double().eval()
        if hf.lm_head.weight.data_ptr() != hf.shared.weight.data_ptr():
            raise AssertionError("HF T5's lm_head is not tied to the shared embedding")
        links = t5_links(ours, hf)
        copy_links(links)
        src, src_len, src_real = _padded_batch(cfg.vocab_size)
        tgt, tgt_len, tgt_real = _padded_batch(cfg.vocab_size, B=src.shape[0])
        out = hf(
            input_ids=src,
            attention_mask=src_real.long(),
            decoder_input_ids=tgt,
            decoder_attention_mask=tgt_real.long(),
        )
        memory = ours.encode(src, src_len)
        got = ours.logits(ours.decode(tgt, memory, src_len, tgt_len))
        m.diff(memory[src_real], out.encoder_last_hidden_state[src_real], "encoder states")
        m.diff(got[tgt_real], out.logits[tgt_real], "logits")
        backward_both(got, out.logits, tgt_real[..., None])
        m.value(grad_error(links))
        m.case()


# --------------------------------------------------------------------------- ELECTRA, ALBERT


def bert_embedding_links(ours: nn.Module, theirs: nn.Module, name: str = "emb") -> list[Link]:
    """BertEmbeddings-style HF module (word, position, token type, LayerNorm) -> attnlab's."""
    links = [
        Link(ours.word.weight, (theirs.word_embeddings.weight,), name=f"{name}.word"),
        Link(
            ours.position.embedding.weight, (theirs.position_embeddings.weight,), name=f"{name}.pos"
        ),
        Link(ours.token_type.weight, (theirs.token_type_embeddings.weight,), name=f"{name}.type"),
    ]
    return links + _norm(ours.norm, theirs.LayerNorm, f"{name}.norm")


def _mha(ours: nn.Module, q: nn.Linear, k: nn.Linear, v: nn.Linear, name: str) -> list[Link]:
    """HF query/key/value -> MultiHeadAttention's q_proj and kv_proj (keys, then values)."""
    return [
        *_lin(ours.q_proj, q, f"{name}.q"),
        Link(ours.kv_proj.weight, (k.weight, v.weight), _cat, f"{name}.kv.weight"),
        Link(ours.kv_proj.bias, (k.bias, v.bias), _cat, f"{name}.kv.bias"),
    ]


def _qkv(ours: nn.Linear, q: nn.Linear, k: nn.Linear, v: nn.Linear, name: str) -> list[Link]:
    """HF query/key/value -> one packed Linear (rows q, k, v), as DeBERTa's attention has."""
    return [
        Link(ours.weight, (q.weight, k.weight, v.weight), _cat, f"{name}.qkv.weight"),
        Link(ours.bias, (q.bias, k.bias, v.bias), _cat, f"{name}.qkv.bias"),
    ]


def bert_layer_links(ours: nn.Module, theirs: nn.Module, name: str) -> list[Link]:
    """BertLayer / ElectraLayer -> a post-norm Block."""
    a = theirs.attention
    links = _mha(ours.self_attn, a.self.query, a.self.key, a.self.value, name)
    links += _lin(ours.self_attn.out_proj, a.output.dense, f"{name}.out")
    links += _norm(ours.norm1, a.output.LayerNorm, f"{name}.norm1")
    links += _lin(ours.ff.w_in, theirs.intermediate.dense, f"{name}.ff.in")
    links += _lin(ours.ff.w_out, theirs.output.dense, f"{name}.ff.out")
    return links + _norm(ours.norm2, theirs.output.LayerNorm, f"{name}.norm2")


def electra_model_links(ours: nn.Module, theirs: nn.Module) -> list[Link]:
    """ElectraModel -> attnlab's ElectraModel."""
    links = bert_embedding_links(ours.embeddings, theirs.embeddings)
    if ours.project is not None:
        links += _lin(ours.project, theirs.embeddings_project, "embeddings_project")
    for i, (mine, ref) in enumerate(zip(ours.encoder.blocks, theirs.encoder.layer, strict=True)):
        links += bert_layer_links(mine, ref, f"layer{i}")
    return _covers(ours, links)


def electra_links(ours: nn.Module, theirs: nn.Module) -> list[Link]:
    """ElectraForPreTraining -> ElectraDiscriminator, or ElectraForMaskedLM -> ElectraGenerator."""
    links = electra_model_links(ours.electra, theirs.electra)
    if hasattr(theirs, "discriminator_predictions"):
        head = theirs.discriminator_predictions
        links += _lin(ours.dense, head.dense, "disc.dense")
        links += _lin(ours.prediction, head.dense_prediction, "disc.prediction")
    else:
        links += _lin(ours.dense, theirs.generator_predictions.dense, "gen.dense")
        links += _norm(ours.norm, theirs.generator_predictions.LayerNorm, "gen.norm")
        links.append(Link(ours.bias, (theirs.generator_lm_head.bias,), name="gen.bias"))
    return _covers(ours, links)


def albert_links(ours: nn.Module, theirs: nn.Module) -> list[Link]:
    """AlbertModel (one layer group of one layer) -> attnlab's AlbertModel."""
    links = bert_embedding_links(ours.embeddings, theirs.embeddings)
    links += _lin(ours.project, theirs.encoder.embedding_hidden_mapping_in, "mapping_in")
    ref = theirs.encoder.albert_layer_groups[0].albert_layers[0]
    a, mine = ref.attention, ours.layer
    links += _mha(mine.self_attn, a.query, a.key, a.value, "layer")
    links += _lin(mine.self_attn.out_proj, a.dense, "layer.out")
    links += _norm(mine.norm1, a.LayerNorm, "layer.norm1")
    links += _lin(mine.ff.w_in, ref.ffn, "layer.ffn")
    links += _lin(mine.ff.w_out, ref.ffn_output, "layer.ffn_output")
    links += _norm(mine.norm2, ref.full_layer_layer_norm, "layer.norm2")
    links += _lin(ours.pooler, theirs.pooler, "pooler")
    return _covers(ours, links)


def _bert_like_config(tf: object, kind: str) -> dict:
    """A tiny random BERT-family HF config dict (no dropout); E may differ from D."""
    H = randint(1, 4)
    return dict(
        vocab_size=randint(20, 60),
        embedding_size=randint(3, 12),
        hidden_size=H * randint(2, 6),
        num_hidden_layers=randint(1, 3),
        num_attention_heads=H,
        intermediate_size=randint(8, 40),
        max_position_embeddings=32,
        type_vocab_size=2,
        hidden_act=choice(["gelu", "gelu_new", "relu"]),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-12,
    )


def _electra_config(hf: dict) -> object:
    from attnlab.models.bert import HF_ACTIVATIONS
    from attnlab.models.electra import ElectraConfig

    return ElectraConfig(
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        embedding_size=hf["embedding_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"],
        d_ff=hf["intermediate_size"],
        context=hf["max_position_embeddings"],
        type_vocab_size=hf["type_vocab_size"],
        norm_eps=hf["layer_norm_eps"],
        dropout=0.0,
        attn_dropout=0.0,
        activation=HF_ACTIVATIONS[hf["hidden_act"]],
    )


def check_electra(m: Measure, cases: int = 4) -> None:
    """ElectraForPreTraining == ElectraDiscriminator (replaced-token logits) and
    ElectraForMaskedLM == ElectraGenerator (vocabulary logits, word embeddings tied to the
    output), on real tokens of a right-padded batch, and every parameter gradient; float64."""
    from attnlab.models.electra import ElectraDiscriminator, ElectraGenerator

    tf = _transformers()
    for i in range(cases):
        hf_cfg = _bert_like_config(tf, "electra")
        if i % 2:
            hf, ours = tf.ElectraForMaskedLM(tf.ElectraConfig(**hf_cfg)), ElectraGenerator
        else:
            hf, ours = tf.ElectraForPreTraining(tf.ElectraConfig(**hf_cfg)), ElectraDiscriminator
        hf.config._attn_implementation = "eager"
        hf = scramble(hf).double().eval()
        ours = ours(_electra_config(hf_cfg)).double().eval()
        links = electra_links(ours, hf)
        copy_links(links)
        ids, lengths, real = _padded_batch(hf_cfg["vocab_size"])
        want = hf(input_ids=ids, attention_mask=real.long()).logits
        got = ours(ids, lengths)
        m.diff(got[real], want[real], "logits")
        backward_both(got, want, real[..., None] if got.dim() == 3 else real)
        m.value(grad_error(links))
        m.case()


def check_albert(m: Measure, cases: int = 4) -> None:
    """AlbertModel == attnlab's AlbertModel (factorised embedding, one block shared across
    a depth of 2-3): hidden states on real tokens, the pooler, every parameter gradient; float64."""
    from attnlab.models.albert import AlbertModel

    tf = _transformers()
    for _ in range(cases):
        hf_cfg = _bert_like_config(tf, "albert")
        hf_cfg["num_hidden_layers"] = randint(2, 3)  # sharing across depth needs depth
        hf = tf.AlbertModel(tf.AlbertConfig(**hf_cfg), add_pooling_layer=True)
        hf.config._attn_implementation = "eager"
        hf = scramble(hf).double().eval()
        ours = AlbertModel(_electra_config(hf_cfg)).double().eval()
        links = albert_links(ours, hf)
        copy_links(links)
        ids, lengths, real = _padded_batch(hf_cfg["vocab_size"])
        out = hf(input_ids=ids, attention_mask=real.long())
        got = ours(ids, lengths)
        m.diff(got[real], out.last_hidden_state[real], "hidden states")
        pooled = ours.pool(got)
        m.diff(pooled, out.pooler_output, "pooler")
        cot, cot_pool = torch.randn_like(got) * real[..., None], torch.randn_like(pooled)
        ((got * cot).sum() + (pooled * cot_pool).sum()).backward()
        ((out.last_hidden_state * cot).sum() + (out.pooler_output * cot_pool).sum()).backward()
        m.value(grad_error(links))
        m.case()


# --------------------------------------------------------------------------- DeBERTa


def deberta_links(ours: nn.Module, theirs: nn.Module) -> list[Link]:
    """DebertaV2Model -> attnlab's DebertaModel, every parameter."""
    e, he = ours.embeddings, theirs.embeddings
    links = [Link(e.word.weight, (he.word_embeddings.weight,), name="word")]
    if e.position is not None:
        links.append(Link(e.position.weight, (he.position_embeddings.weight,), name="position"))
    if e.token_type is not None:
        links.append(Link(e.token_type.weight, (he.token_type_embeddings.weight,), name="type"))
    if e.project is not None:
        links.append(Link(e.project.weight, (he.embed_proj.weight,), name="embed_proj"))
    links += _norm(e.norm, he.LayerNorm, "emb.norm")
    enc = theirs.encoder
    links.append(Link(ours.rel_embeddings.weight, (enc.rel_embeddings.weight,), name="rel"))
    if ours.rel_norm is not None:
        links += _norm(ours.rel_norm, enc.LayerNorm, "rel.norm")
    for i, (mine, ref) in enumerate(zip(ours.layers, enc.layer, strict=True)):
        a, name = ref.attention.self, f"layer{i}"
        links += _qkv(mine.attn.qkv, a.query_proj, a.key_proj, a.value_proj, name)
        if mine.attn.pos_key is not None:
            links += _lin(mine.attn.pos_key, a.pos_key_proj, f"{name}.pos_key")
        if mine.attn.pos_query is not None:
            links += _lin(mine.attn.pos_query, a.pos_query_proj, f"{name}.pos_query")
        links += _lin(mine.attn.out_proj, ref.attention.output.dense, f"{name}.out")
        links += _norm(mine.norm1, ref.attention.output.LayerNorm, f"{name}.norm1")
        links += _lin(mine.ff.w_in, ref.intermediate.dense, f"{name}.ff.in")
        links += _lin(mine.ff.w_out, ref.output.dense, f"{name}.ff.out")
        links += _norm(mine.norm2, ref.output.LayerNorm, f"{name}.norm2")
    return _covers(ours, links)


@contextmanager
def deberta_scale_in_float64() -> Iterator[None]:
    """HF's DeBERTa rounds its score scale √(d·factor) through float32 whatever the input; while
    active the same √ is taken in float64, so that a float64 comparison is exact."""
    from transformers.models.deberta_v2 import modeling_deberta_v2 as md

    def scaled_size_sqrt(layer: Tensor, scale_factor: int) -> Tensor:
        return torch.sqrt(torch.tensor(layer.size(-1) * scale_factor, dtype=F64))

    original = md.scaled_size_sqrt
    md.scaled_size_sqrt = scaled_size_sqrt
    try:
        yield
    finally:
        md.scaled_size_sqrt = original


def check_deberta(m: Measure, cases: int = 6) -> None:
    """See :func:`_check_deberta`; HF's scale in float64 (:func:`deberta_scale_in_float64`)."""
    with deberta_scale_in_float64():
        _check_deberta(m, cases)


def _check_deberta(m: Measure, cases: int) -> None:
    """DebertaV2Model == attnlab's DebertaModel over v2 and v3 layouts (absolute positions on or
    off, shared or own position projections, c2p and/or p2c, log buckets or plain clipping,
    E ≠ D): hidden states on real tokens of a right-padded batch, every parameter gradient;
    float64. Sequences up to 40 tokens pass the bucket boundary."""
    from attnlab.models.bert import HF_ACTIVATIONS
    from attnlab.models.deberta import DebertaConfig, DebertaModel

    tf = _transformers()
    pos_att = {"c2p+p2c": "p2c|c2p", "c2p": "c2p", "p2c": "p2c"}
    for i in range(cases):
        H = randint(1, 4)
        buckets = choice([0, randint(4, 12)])
        cfg = DebertaConfig(
            vocab_size=randint(20, 60),
            d_model=H * randint(2, 6),
            embedding_size=choice([0, randint(3, 10)]),
            n_layers=randint(1, 3),
            n_heads=H,
            d_ff=randint(8, 40),
            context=48,
            type_vocab_size=choice([0, 2]),
            position_biased_input=choice([False, True]),
            max_relative_positions=choice([0, randint(6, 30)]),
            position_buckets=buckets,
            share_att_key=choice([False, True]),
            pos_att=choice(list(pos_att)) if i else "c2p+p2c",
            norm_rel_ebd=choice([False, True]),
            dropout=0.0,
            attn_dropout=0.0,
            activation=choice(["gelu", "relu"]),
        )
        act = {v: k for k, v in HF_ACTIVATIONS.items() if k != "gelu_pytorch_tanh"}
        hf_cfg = tf.DebertaV2Config(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.d_model,
            embedding_size=cfg.emb,
            num_hidden_layers=cfg.n_layers,
            num_attention_heads=H,
            intermediate_size=cfg.d_ff,
            max_position_embeddings=cfg.context,
            type_vocab_size=cfg.type_vocab_size,
            position_biased_input=cfg.position_biased_input,
            relative_attention=True,
            max_relative_positions=cfg.max_relative_positions or -1,
            position_buckets=buckets or -1,
            share_att_key=cfg.share_att_key,
            pos_att_type=pos_att[cfg.pos_att],
            norm_rel_ebd="layer_norm" if cfg.norm_rel_ebd else "none",
            layer_norm_eps=cfg.norm_eps,
            hidden_act=act[cfg.activation],
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        hf = scramble(tf.DebertaV2Model(hf_cfg)).double().eval()
        ours = DebertaModel(cfg).double().eval()
        links = deberta_links(ours, hf)
        copy_links(links)
        B, T = randint(1, 3), randint(2, 40)
        lengths = torch.randint(1, T + 1, (B,))
        lengths[0] = T
        real = torch.arange(T)[None] < lengths[:, None]
        ids = torch.randint(1, cfg.vocab_size, (B, T)).masked_fill(~real, 0)
        want = hf(input_ids=ids, attention_mask=real.long()).last_hidden_state
        got = ours(ids, lengths)
        m.diff(got[real], want[real], "hidden states")
        backward_both(got, want, real[..., None])
        m.value(grad_error(links))
        m.case()
