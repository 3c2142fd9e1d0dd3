"""Parity checks against Hugging Face ``transformers`` models with copied random weights.

Each check builds a tiny random configuration, scrambles HF's weights (far from init, so that
a transposed or swapped tensor shows), copies them into attnlab's module through
:mod:`attnlab.verify.copy_weights` (or attnlab's own checkpoint loaders), and compares outputs
and, where the check says so, gradients. float64 where HF computes in the input's dtype;
float32 where HF rounds through float32 whatever the input (LLaMA's RMSNorm, Mixtral's
router), with the tolerance set for float32.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch
from torch import Tensor, nn

from attnlab.interop.hf_gpt2 import load_hf_gpt2
from attnlab.layers.attention import MultiHeadAttention
from attnlab.layers.blocks import Block, BlockConfig, BlockStack, RMSNorm
from attnlab.layers.moe import MoEFeedForward, load_balancing_loss
from attnlab.layers.positions import RotaryEmbedding, T5RelativePositionBias
from attnlab.models.bert import BertConfig, BertModel
from attnlab.models.bert_folder import load_bert_weights
from attnlab.models.vit import ViT, ViTConfig
from attnlab.verify.check import Measure
from attnlab.verify.checks_torch import choice, randint
from attnlab.verify.copy_weights import (
    Link,
    copy_links,
    copy_t5_attention,
    copy_vit,
    llama_model_links,
    max_grad_error,
    mixtral_moe_links,
)

F64 = torch.float64


def _transformers():
    import transformers

    transformers.logging.set_verbosity_error()  # no "falling back to PyTorch" notices
    transformers.logging.disable_progress_bar()  # nor bars for saving/loading tiny models
    return transformers


def scramble(model: nn.Module, std: float = 0.2) -> nn.Module:
    """Matrices N(0, std), vectors N(1, std) (norm gains near one, biases off zero)."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std) if p.dim() >= 2 else p.normal_(1.0, std)
    return model


def backward_both(got: Tensor, want: Tensor, weight: Tensor | None = None) -> None:
    cot = torch.randn_like(want) if weight is None else torch.randn_like(want) * weight
    (got * cot).sum().backward()
    (want * cot).sum().backward()


# --------------------------------------------------------------------------- LLaMA


def llama_stack_pair(tf: Any, config: Any) -> tuple[nn.Module, nn.Embedding, BlockStack, list]:
    """A ``LlamaModel`` of ``config`` (weights scrambled off HF's init, std 0.15) and attnlab's
    nn.Embedding + BlockStack(RMSNorm, SwiGLU, RoPE, GQA) + RMSNorm holding the same weights,
    with the links between them."""
    hf = scramble(tf.LlamaModel(config), 0.15)
    d, H = config.hidden_size, config.num_attention_heads
    block = BlockConfig(
        d,
        H,
        config.intermediate_size,
        n_kv_heads=config.num_key_value_heads,
        activation="swiglu",
        norm="rms",
        norm_position="pre",
        norm_eps=config.rms_norm_eps,
        dropout=0.0,
        bias=False,
    )
    rope = RotaryEmbedding(d // H, base=config.rope_parameters["rope_theta"])
    blocks = [Block(block, rope) for _ in range(config.num_hidden_layers)]
    stack = BlockStack(blocks, RMSNorm(d, eps=config.rms_norm_eps))
    embedding = nn.Embedding(config.vocab_size, d)
    links = llama_model_links(embedding, stack, hf)
    copy_links(links)
    return hf, embedding, stack, links


def check_llama(m: Measure, cases: int = 3, gradients: bool = False) -> None:
    """LlamaModel == nn.Embedding + BlockStack(RMSNorm, SwiGLU, RoPE, GQA, causal) + RMSNorm,
    float32, with left padding: hidden states on real tokens, or every parameter gradient."""
    tf = _transformers()
    for _ in range(cases):
        kv = choice([1, 2])
        H, head = kv * choice([1, 2]), 2 * randint(2, 4)
        config = tf.LlamaConfig(
            vocab_size=50,
            hidden_size=H * head,
            intermediate_size=randint(8, 40),
            num_hidden_layers=randint(1, 2),
            num_attention_heads=H,
            num_key_value_heads=kv,
            max_position_embeddings=64,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
        config._attn_implementation = choice(["eager", "sdpa"])
        hf, embedding, stack, links = llama_stack_pair(tf, config)
        B, T = randint(1, 3), randint(2, 10)
        ids = torch.randint(0, config.vocab_size, (B, T))
        pads = torch.randint(0, T, (B,))
        pads[0] = 0
        real = torch.arange(T)[None] >= pads[:, None]  # (B, T) left padding
        want = hf(input_ids=ids, attention_mask=real.long()).last_hidden_state
        got = stack(embedding(ids), real[:, None, None, :], is_causal=True)
        if gradients:
            backward_both(got, want, real[..., None])
            m.value(max_grad_error(links))
        else:
            m.diff(got[real], want[real])
        m.case()


# --------------------------------------------------------------------------- T5


def check_t5(m: Measure, cases: int = 3) -> None:
    """T5Attention (encoder: bidirectional buckets; decoder: causal) == MultiHeadAttention with
    T5RelativePositionBias, float64; and the bias table's gradient == compute_bias's."""
    tf = _transformers()
    from transformers.models.t5.modeling_t5 import T5Attention

    for _ in range(cases):
        for is_decoder in (False, True):
            H, dk = randint(1, 4), randint(2, 6)
            # max_distance must exceed the exact range (buckets / 2 causal, / 4 bidirectional):
            # at equality both T5's and attnlab's bucket formulas divide by log(1) = 0
            buckets = randint(4, 16)
            distance = randint(buckets // 2 + 1, 40)
            config = tf.T5Config(
                d_model=randint(8, 24),
                d_kv=dk,
                num_heads=H,
                relative_attention_num_buckets=buckets,
                relative_attention_max_distance=distance,
                is_decoder=is_decoder,
                dropout_rate=0.0,
            )
            config._attn_implementation = "eager"
            hf = scramble(T5Attention(config, has_relative_attention_bias=True, layer_idx=0))
            hf = hf.double()
            mha = MultiHeadAttention(config.d_model, H, head_dim=dk, bias=False).double()
            rel = T5RelativePositionBias(H, buckets, distance, bidirectional=not is_decoder)
            rel = rel.double()
            copy_t5_attention(mha, rel, hf)
            B, T = randint(1, 3), randint(1, 12)
            x = torch.randn(B, T, config.d_model, dtype=F64)
            causal = torch.ones(T, T, dtype=torch.bool).tril()
            hf_mask = torch.zeros(1, 1, T, T, dtype=F64).masked_fill(~causal, float("-inf"))
            want = hf(x, mask=hf_mask if is_decoder else None)[0]
            got, _ = mha(x, is_causal=is_decoder, bias=rel(T, T))
            m.diff(got, want)
            t_q, t_k = randint(1, 8), randint(8, 60)
            links = [Link(rel.embedding.weight, (hf.relative_attention_bias.weight,), name="bias")]
            got_b, want_b = rel(t_q, t_k), hf.compute_bias(t_q, t_k, past_seen_tokens=t_k - t_q)
            m.diff(got_b, want_b, "position bias")
            backward_both(got_b, want_b)
            m.value(max_grad_error(links))
            m.case()


# --------------------------------------------------------------------------- GPT-2, ViT, BERT


def check_gpt2(m: Measure, cases: int = 3) -> None:
    """GPT2LMHeadModel saved to a directory and read by ``load_hf_gpt2``: logits and the
    gradients of the tied embedding and the positions, float64."""
    tf = _transformers()
    for _ in range(cases):
        n_head = randint(1, 4)
        config = tf.GPT2Config(
            vocab_size=randint(20, 80),
            n_positions=32,
            n_embd=n_head * randint(2, 8),
            n_layer=randint(1, 3),
            n_head=n_head,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
        )
        config._attn_implementation = "eager"
        hf = scramble(tf.GPT2LMHeadModel(config)).eval()
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp)
            ours = load_hf_gpt2(tmp).double()
        hf = hf.double()
        ids = torch.randint(0, config.vocab_size, (randint(1, 3), randint(1, 20)))
        want, got = hf(ids).logits, ours(ids)
        m.diff(got, want)
        backward_both(got, want)
        m.diff(ours.tok_emb.weight.grad, hf.transformer.wte.weight.grad, "wte gradient")
        m.diff(ours.pos_emb.embedding.weight.grad, hf.transformer.wpe.weight.grad, "wpe grad")
        m.case()


def hf_vit_config(cfg: ViTConfig) -> Any:
    """The Hugging Face ViTConfig of the same network as attnlab's ``cfg`` (no dropout; eager
    attention, which returns the weights)."""
    return _transformers().ViTConfig(
        hidden_size=cfg.d_model,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        intermediate_size=cfg.d_ff,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
        num_channels=cfg.in_channels,
        layer_norm_eps=cfg.norm_eps,
        qkv_bias=True,
        num_labels=cfg.n_classes,
        attn_implementation="eager",
    )


def check_vit(m: Measure, cases: int = 3) -> None:
    """ViTForImageClassification == attnlab's ViT: every hidden state, attention weights and
    logits, float32 (HF's eager attention, the one that returns weights, softmaxes in float32)."""
    tf = _transformers()
    for _ in range(cases):
        H, patch = randint(1, 4), choice([2, 4])
        cfg = ViTConfig(
            image_size=patch * randint(1, 4),
            in_channels=choice([1, 3]),
            patch_size=patch,
            d_model=H * randint(2, 8),
            n_layers=randint(1, 2),
            n_heads=H,
            d_ff=randint(8, 48),
            dropout=0.0,
            norm_eps=1e-12,
            n_classes=randint(2, 6),
        )
        hf = tf.ViTForImageClassification(hf_vit_config(cfg)).eval()
        with torch.no_grad():  # HF's cls/position tables start near zero: randomise all
            for p in hf.parameters():
                p.normal_(0, 0.3)
        model = ViT(cfg).eval()
        copy_vit(model, hf)
        images = torch.randn(randint(1, 3), cfg.in_channels, cfg.image_size, cfg.image_size)
        with torch.no_grad():
            ref = hf.vit(images, output_hidden_states=True, output_attentions=True)
            ref_logits = hf(images).logits
            ours = model.inspect(images)
        for a, b in zip(ours["hidden_states"], ref.hidden_states, strict=True):
            m.diff(a, b, "hidden state")
        m.diff(ours["attention"], torch.stack(ref.attentions), "attention")
        m.diff(ours["logits"], ref_logits, "logits")
        m.case()


def check_bert(m: Measure, cases: int = 3) -> None:
    """HF BertModel (random) read by ``load_bert_weights``: hidden states on real tokens of a
    right-padded batch, the pooler, and the word-embedding gradient, float64."""
    tf = _transformers()
    for _ in range(cases):
        H = randint(1, 4)
        hf_cfg = dict(
            vocab_size=randint(20, 60),
            hidden_size=H * randint(2, 8),
            num_hidden_layers=randint(1, 2),
            num_attention_heads=H,
            intermediate_size=randint(8, 48),
            max_position_embeddings=32,
            type_vocab_size=2,
            hidden_act=choice(["gelu", "relu"]),
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        hf = scramble(tf.BertModel(tf.BertConfig(**hf_cfg), add_pooling_layer=True))
        hf = hf.double().eval()
        hf.config._attn_implementation = "eager"
        ours = BertModel(BertConfig.from_hf({"model_type": "bert", **hf_cfg}))
        load_bert_weights(ours, {k: v.float() for k, v in hf.state_dict().items()})
        hf = hf.float().double()  # the float32 values that were copied
        ours = ours.double().eval()
        B, T = randint(1, 4), randint(2, 16)
        lengths = torch.randint(1, T + 1, (B,))
        lengths[0] = T
        real = torch.arange(T)[None] < lengths[:, None]
        ids = torch.randint(1, hf_cfg["vocab_size"], (B, T)).masked_fill(~real, 0)
        got = ours(ids, lengths)
        want = hf(input_ids=ids, attention_mask=real.long())
        m.diff(got[real], want.last_hidden_state[real])
        m.diff(ours.pool(got), want.pooler_output, "pooler")
        backward_both(got, want.last_hidden_state, real[..., None])
        m.diff(
            ours.embeddings.word.weight.grad,
            hf.embeddings.word_embeddings.weight.grad,
            "word embedding gradient",
        )
        m.case()


# --------------------------------------------------------------------------- Mixtral
# (Mamba and RWKV: checks_mixers.py)


def check_mixtral(m: Measure, cases: int = 6, gradients: bool = False) -> None:
    """MixtralSparseMoeBlock == MoEFeedForward(swiglu), float32 (HF routes in float32): outputs
    and router logits, or the input and every parameter gradient."""
    tf = _transformers()
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    for _ in range(cases):
        E = randint(2, 8)
        k = randint(1, min(E, 3))
        D, F_ = randint(4, 24), randint(4, 32)
        config = tf.MixtralConfig(
            hidden_size=D, intermediate_size=F_, num_local_experts=E, num_experts_per_tok=k
        )
        config._experts_implementation = "eager"
        hf = MixtralSparseMoeBlock(config)
        with torch.no_grad():  # O(1) outputs: float32 rounding is then ~1e-7 absolute
            hf.gate.weight.normal_(0.0, 0.5)
            hf.experts.gate_up_proj.normal_(0.0, D**-0.5)
            hf.experts.down_proj.normal_(0.0, F_**-0.5)
        ours = MoEFeedForward(D, F_, experts=E, top_k=k, activation="swiglu")
        links = mixtral_moe_links(ours, hf)
        copy_links(links)
        x = torch.randn(randint(1, 3), randint(1, 16), D)
        x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
        want, got = hf(x_hf), ours(x_ours)
        if gradients:
            backward_both(got, want)
            m.diff(x_ours.grad, x_hf.grad, "input gradient")
            m.value(max_grad_error(links))
        else:
            m.diff(got, want)
            m.diff(ours.stats.router_logits, hf.gate(x.reshape(-1, D))[0], "router logits")
        m.case()


def check_balance_loss(m: Measure, cases: int = 8) -> None:
    """attnlab's load-balancing loss == HF's ``load_balancing_loss_func`` (value and gradient),
    one or several layers, with or without an attention mask; float64 logits (HF still divides
    its counts in float32)."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    for _ in range(cases):
        E, B, T, layers = randint(2, 8), randint(1, 4), randint(1, 12), randint(1, 3)
        k = randint(1, min(E, 3))
        logits = (torch.randn(layers * B * T, E, dtype=F64) * 2).requires_grad_()
        mask = (torch.rand(B, T) > 0.3).long() if choice([False, True]) else None
        if mask is not None:
            mask[0, 0] = 1
        want = load_balancing_loss_func(tuple(logits.chunk(layers)), E, k, mask)
        pooled = None if mask is None else mask.reshape(-1).repeat(layers)
        got = load_balancing_loss(logits, k, pooled)
        m.diff(got, want, "balance loss")
        (g_want,) = torch.autograd.grad(want, logits)
        (g_got,) = torch.autograd.grad(got, logits)
        m.diff(g_got, g_want, "balance loss gradient")
        m.case()
