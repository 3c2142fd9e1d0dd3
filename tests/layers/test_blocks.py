"""attnlab.layers.blocks against PyTorch's Transformer layers (and HF LLaMA's norm and MLP).

* RMSNorm == ``nn.RMSNorm`` (float32/float64, gradients) and == HF ``LlamaRMSNorm`` in bfloat16;
* FeedForward gelu_tanh == Linear/GELU(tanh)/Linear; swiglu == HF ``LlamaMLP`` (w_in = [gate; up]);
* Block == ``nn.TransformerEncoderLayer`` and DecoderBlock == ``nn.TransformerDecoderLayer``
  with copied weights, post- and pre-norm, relu and gelu, padding and causal masks, forward and
  input/parameter gradients in float64;
* BlockStack + Decoder with final LayerNorms == ``nn.Transformer`` (batch_first, src/tgt/memory
  key padding masks, causal tgt mask), forward and gradients;
* gradient checkpointing changes neither outputs nor gradients (dropout on) and does recompute;
* KV caches through an BlockStack used causally (GQA, RoPE, RMSNorm, SwiGLU) and through a Decoder
  (self cache + static cross cache) == full recomputation.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor, nn

from _verify import assert_verified
from attnlab.layers.attention import KVCache, from_key_padding_mask
from attnlab.layers.blocks import (
    Block,
    BlockConfig,
    BlockStack,
    Decoder,
    DecoderBlock,
    DyT,
    FeedForward,
    RMSNorm,
    make_norm,
)
from attnlab.layers.positions import RotaryEmbedding
from attnlab.verify import checks_torch
from attnlab.verify.check import Measure
from attnlab.verify.copy_weights import (
    Link,
    assert_grads_match,
    copy_links,
    layer_norm_links,
    linear_links,
    llama_mlp_links,
)

pytestmark = pytest.mark.usefixtures("on_test_device")  # tests/_device.py: ATTNLAB_TEST_DEVICE

F64 = torch.float64
TIGHT = dict(rtol=1e-9, atol=1e-11)


def compare_backward(
    got: Tensor, want: Tensor, inputs: list[tuple[Tensor, Tensor]], links: list[Link]
) -> None:
    """Same cotangent through both: input gradients and parameter gradients must agree."""
    cot = torch.randn_like(want)
    (got * cot).sum().backward()
    (want * cot).sum().backward()
    for ours, theirs in inputs:
        torch.testing.assert_close(ours.grad, theirs.grad)
    assert_grads_match(links)


# --------------------------------------------------------------------------- norms and FFN


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_rms_norm_matches_torch(dtype: torch.dtype) -> None:
    ours, theirs = RMSNorm(12, eps=1e-6).to(dtype), nn.RMSNorm(12, eps=1e-6, dtype=dtype)
    nn.init.normal_(theirs.weight)
    links = layer_norm_links(ours, theirs)
    copy_links(links)
    x, x_ref = (t.to(dtype) for t in checks_torch.twin(3, 5, 12))
    x, x_ref = x.detach().requires_grad_(), x_ref.detach().requires_grad_()
    got, want = ours(x), theirs(x_ref)
    torch.testing.assert_close(got, want)
    compare_backward(got, want, [(x, x_ref)], links)


def test_rms_norm_bfloat16_normalises_in_float32_like_llama() -> None:
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    ours, theirs = RMSNorm(16, eps=1e-5), LlamaRMSNorm(16, eps=1e-5)
    nn.init.normal_(theirs.weight)
    copy_links(layer_norm_links(ours, theirs))
    ours, theirs = ours.bfloat16(), theirs.bfloat16()
    x = torch.randn(4, 16).bfloat16() * 30
    got = ours(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, theirs(x))


def test_make_norm() -> None:
    assert isinstance(make_norm("layer", 8), nn.LayerNorm)
    assert make_norm("layer", 8, bias=False).bias is None
    assert isinstance(make_norm("rms", 8), RMSNorm)
    assert isinstance(make_norm("dyt", 8), DyT)
    with pytest.raises(ValueError, match="norm must be one of layer, rms, dyt, got 'batch'"):
        make_norm("batch", 8)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match="activation must be one of relu, gelu, gelu_tanh, swiglu, relu2"
    ):
        FeedForward(8, 16, "tanh")  # type: ignore[arg-type]


def test_feed_forward_gelu_tanh() -> None:
    ours = FeedForward(8, 20, "gelu_tanh").double()
    ref = nn.Sequential(nn.Linear(8, 20), nn.GELU(approximate="tanh"), nn.Linear(20, 8)).double()
    links = linear_links(ours.w_in, ref[0].weight, ref[0].bias, "in")
    links += linear_links(ours.w_out, ref[2].weight, ref[2].bias, "out")
    copy_links(links)
    x, x_ref = checks_torch.twin(2, 3, 8)
    got, want = ours(x), ref(x_ref)
    torch.testing.assert_close(got, want)
    compare_backward(got, want, [(x, x_ref)], links)


def test_feed_forward_swiglu_matches_llama_mlp() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    config = transformers.LlamaConfig(
        hidden_size=12, intermediate_size=20, num_attention_heads=2, mlp_bias=False
    )
    theirs = LlamaMLP(config).double()
    ours = FeedForward(12, 20, "swiglu", dropout=0.0, bias=False).double()
    links = llama_mlp_links(ours, theirs)
    copy_links(links)
    x, x_ref = checks_torch.twin(2, 5, 12)
    got, want = ours(x), theirs(x_ref)
    torch.testing.assert_close(got, want)
    compare_backward(got, want, [(x, x_ref)], links)


# --------------------------------------------------------------------------- layers


MASKS = ["none", "padding", "causal", "padding+causal"]


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_matches_torch_layer(norm_first: bool, activation: str) -> None:
    m = Measure()
    for bias, padding, causal in itertools.product([False, True], repeat=3):
        checks_torch.encoder_layer_case(
            m, 16, 4, 24, 3, 6, norm_first=norm_first, activation=activation, bias=bias,
            padding=padding, causal=causal,
        )  # fmt: skip
    assert_verified(m, "Block (encoder layer)")


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_block_matches_torch_layer(norm_first: bool, activation: str) -> None:
    m = Measure()
    for padding, memory_padding, causal in itertools.product([False, True], repeat=3):
        checks_torch.decoder_layer_case(
            m, 16, 2, 20, 3, 5, 7, norm_first=norm_first, activation=activation,
            padding=padding, memory_padding=memory_padding, causal=causal,
        )  # fmt: skip
    assert_verified(m, "DecoderBlock")


@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")
@pytest.mark.parametrize("norm_first, activation", [(False, "relu"), (True, "gelu")])
def test_encoder_decoder_stack_matches_nn_transformer(norm_first: bool, activation: str) -> None:
    m = Measure()
    checks_torch.transformer_case(
        m, 16, 4, 32, 2, 3, 7, 5, norm_first=norm_first, activation=activation
    )
    assert_verified(m, "BlockStack + Decoder")


# --------------------------------------------------------------------------- checkpointing


def _count_calls(modules: list[nn.Module]) -> list[int]:
    count = [0]
    for m in modules:
        # a pre-hook: the recomputation stops early, once it has what the backward pass needs
        m.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    return count


def test_gradient_checkpointing_encoder_same_outputs_and_gradients() -> None:
    d, H, B, T, n = 16, 4, 2, 6, 3
    enc = BlockStack(
        [Block(BlockConfig(d, H, 32, dropout=0.2, norm_position="pre")) for _ in range(n)],
        nn.LayerNorm(d),
    ).double()
    calls = _count_calls(list(enc.blocks))
    x0 = torch.randn(B, T, d, dtype=F64)
    mask = from_key_padding_mask(checks_torch.right_padding(B, T))
    cot = torch.randn(B, T, d, dtype=F64)
    results = []
    for checkpointing in (False, True):
        enc.gradient_checkpointing = checkpointing
        enc.zero_grad(set_to_none=True)
        calls[0] = 0
        x = x0.clone().requires_grad_()
        torch.manual_seed(1234)  # same dropout masks: checkpointing replays the RNG
        out = enc(x, mask, is_causal=True)
        (out * cot).sum().backward()
        assert calls[0] == (2 * n if checkpointing else n)  # recomputed in the backward pass
        results.append((out, x.grad, [p.grad.clone() for p in enc.parameters()]))
    (o1, gx1, gp1), (o2, gx2, gp2) = results
    torch.testing.assert_close(o1, o2, **TIGHT)
    torch.testing.assert_close(gx1, gx2, **TIGHT)
    for a, b in zip(gp1, gp2):
        torch.testing.assert_close(a, b, **TIGHT)
    enc.eval()  # no checkpointing outside training: one call per block
    calls[0] = 0
    enc(x0.requires_grad_())
    assert calls[0] == n


def test_gradient_checkpointing_decoder_same_outputs_and_gradients() -> None:
    d, H, B, Tq, Tk, n = 16, 2, 2, 5, 6, 2
    dec = Decoder(
        [DecoderBlock(BlockConfig(d, H, 24, dropout=0.2), d_memory=10) for _ in range(n)],
        nn.LayerNorm(d),
    ).double()
    calls = _count_calls(list(dec.blocks))
    y0, m0 = torch.randn(B, Tq, d, dtype=F64), torch.randn(B, Tk, 10, dtype=F64)
    self_mask = from_key_padding_mask(checks_torch.right_padding(B, Tq))
    mem_mask = from_key_padding_mask(checks_torch.right_padding(B, Tk))
    cot = torch.randn(B, Tq, d, dtype=F64)
    results = []
    for checkpointing in (False, True):
        dec.gradient_checkpointing = checkpointing
        dec.zero_grad(set_to_none=True)
        calls[0] = 0
        y, m = y0.clone().requires_grad_(), m0.clone().requires_grad_()
        torch.manual_seed(99)
        out = dec(y, m, self_mask, mem_mask)
        (out * cot).sum().backward()
        assert calls[0] == (2 * n if checkpointing else n)
        results.append((out, y.grad, m.grad, [p.grad.clone() for p in dec.parameters()]))
    (o1, gy1, gm1, gp1), (o2, gy2, gm2, gp2) = results
    for a, b in [(o1, o2), (gy1, gy2), (gm1, gm2), *zip(gp1, gp2)]:
        torch.testing.assert_close(a, b, **TIGHT)


def test_gradient_checkpointing_is_skipped_with_caches() -> None:
    """A cache makes a block stateful: recomputing it would append the keys a second time."""
    cfg = BlockConfig(16, 4, 32, dropout=0.0)
    enc = BlockStack([Block(cfg) for _ in range(2)]).double()
    dec = Decoder([DecoderBlock(cfg) for _ in range(2)]).double()
    x = torch.randn(2, 5, 16, dtype=F64, requires_grad=True)
    memory = torch.randn(2, 3, 16, dtype=F64)
    grads = []
    for checkpointing in (False, True):
        enc.gradient_checkpointing = dec.gradient_checkpointing = checkpointing
        caches = [KVCache() for _ in range(2)]
        out = enc(x, is_causal=True, caches=caches)
        selfc, cross = [KVCache() for _ in range(2)], [KVCache() for _ in range(2)]
        out = dec(out, memory, caches=selfc, cross_caches=cross)
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.isfinite(grad).all()
        assert [c.length for c in caches + selfc] == [5] * 4
        grads.append(grad)
    torch.testing.assert_close(grads[0], grads[1], **TIGHT)


# --------------------------------------------------------------------------- KV caches


def _chunks(prompt: int, total: int) -> list[tuple[int, int]]:
    """A prompt, then single tokens, with one chunk of 3 in the middle."""
    steps = [(0, prompt)]
    t = prompt
    while t < total:
        n = 3 if t == prompt + 4 and t + 3 <= total else 1
        steps.append((t, t + n))
        t += n
    return steps


def test_kv_cache_through_a_causal_encoder_stack() -> None:
    d, H, Hkv, B, T = 32, 4, 2, 2, 21  # T > 16: the caches grow
    rope = RotaryEmbedding(d // H)
    stack = (
        BlockStack(
            [
                Block(
                    BlockConfig(
                        d,
                        H,
                        48,
                        dropout=0.0,
                        activation="swiglu",
                        norm="rms",
                        bias=False,
                        norm_position="pre",
                        n_kv_heads=Hkv,
                    ),
                    rotary=rope,
                )
                for _ in range(3)
            ],
            RMSNorm(d),
        )
        .double()
        .eval()
    )
    x = torch.randn(B, T, d, dtype=F64)
    full = stack(x, is_causal=True)
    caches = [KVCache() for _ in stack.blocks]
    outs = [stack(x[:, s:e], is_causal=True, caches=caches) for s, e in _chunks(4, T)]
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TIGHT)
    assert all(c.length == T for c in caches)


@pytest.mark.parametrize("norm_first", [False, True])
def test_kv_cache_through_a_decoder_with_static_cross_cache(norm_first: bool) -> None:
    d, H, B, Tq, Tk, dm = 16, 4, 3, 19, 8, 12
    dec = (
        Decoder(
            [
                DecoderBlock(
                    BlockConfig(
                        d,
                        H,
                        32,
                        dropout=0.0,
                        n_kv_heads=2,
                        norm_position="pre" if norm_first else "post",
                    ),
                    d_memory=dm,
                )
                for _ in range(2)
            ],
            nn.LayerNorm(d),
        )
        .double()
        .eval()
    )
    y, memory = torch.randn(B, Tq, d, dtype=F64), torch.randn(B, Tk, dm, dtype=F64)
    mem_mask = from_key_padding_mask(checks_torch.right_padding(B, Tk))
    full = dec(y, memory, memory_mask=mem_mask)
    caches = [KVCache() for _ in dec.blocks]
    cross = [KVCache() for _ in dec.blocks]
    outs = [
        dec(y[:, s:e], memory, memory_mask=mem_mask, caches=caches, cross_caches=cross)
        for s, e in _chunks(3, Tq)
    ]
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **TIGHT)
    assert all(c.static and c.length == Tk for c in cross)
    assert all(c.length == Tq and not c.static for c in caches)


def test_stacks_return_attention_weights() -> None:
    d, H, B, T = 16, 4, 2, 5
    cfg = BlockConfig(d, H, 32, dropout=0.0)
    enc = BlockStack([Block(cfg) for _ in range(2)]).double()
    x = torch.randn(B, T, d, dtype=F64)
    out, weights = enc(x, is_causal=True, need_weights=True)
    assert len(weights) == 2 and all(w.shape == (B, H, T, T) for w in weights)
    torch.testing.assert_close(out, enc(x, is_causal=True), **TIGHT)
    for w in weights:
        torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T, dtype=F64))
        assert (w.triu(1) == 0).all()
    dec = Decoder([DecoderBlock(cfg) for _ in range(2)]).double()
    out, weights = dec(x, torch.randn(B, 7, d, dtype=F64), need_weights=True)
    assert [(s.shape, c.shape) for s, c in weights] == [((B, H, T, T), (B, H, T, 7))] * 2


def test_dyt_matches_the_formula_with_gradients_in_float64() -> None:
    """DyT(x) = γ·tanh(α·x) + β (Zhu et al. 2025, eq. 1), α one scalar starting at 0.5; the
    output and the gradients of x, α, γ, β against the formula written out here."""
    norm = make_norm("dyt", 6).double()
    assert norm.alpha.shape == () and norm.alpha.item() == 0.5
    assert torch.equal(norm.weight, torch.ones(6, dtype=F64))
    with torch.no_grad():
        norm.alpha.fill_(0.8)
        norm.weight.normal_(1.0, 0.3)
        norm.bias.normal_(0.0, 0.3)
    x = torch.randn(3, 5, 6, dtype=F64, requires_grad=True)
    alpha = norm.alpha.detach().clone().requires_grad_()
    gamma = norm.weight.detach().clone().requires_grad_()
    beta = norm.bias.detach().clone().requires_grad_()
    got = norm(x)
    want = gamma * ((torch.exp(2 * alpha * x) - 1) / (torch.exp(2 * alpha * x) + 1)) + beta
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    cot = torch.randn_like(want)
    ours = torch.autograd.grad((got * cot).sum(), (x, norm.alpha, norm.weight, norm.bias))
    theirs = torch.autograd.grad((want * cot).sum(), (x, alpha, gamma, beta))
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # d/dx tanh(αx) = α(1 − tanh²(αx)), by hand
    t = torch.tanh(alpha.detach() * x.detach())
    torch.testing.assert_close(ours[0], cot * gamma.detach() * alpha.detach() * (1 - t**2))
    assert make_norm("dyt", 6, bias=False).bias is None


def test_dyt_is_a_norm_choice_of_every_block_and_model() -> None:
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.models.vit import ViT, ViTConfig

    block = Block(BlockConfig(d_model=8, n_heads=2, d_ff=16, norm="dyt"))
    assert isinstance(block.norm1, DyT) and isinstance(block.norm2, DyT)
    gpt = GPT(GPTConfig(vocab_size=11, context=8, n_layers=1, n_heads=2, d_model=8, norm="dyt"))
    vit = ViT(ViTConfig(image_size=8, patch_size=4, d_model=8, n_heads=2, n_layers=1, norm="dyt"))
    for model in (gpt, vit):
        assert not any(isinstance(m, nn.LayerNorm) for m in model.modules())
        assert sum(isinstance(m, DyT) for m in model.modules()) == 3


def test_dyt_alpha0_starts_every_dyt_of_every_model_with_a_norm_choice() -> None:
    """``dyt_alpha0`` is one setting on every model config with a ``norm``: it starts the α of
    every DyT the model builds (blocks, final norms, Swin's merges, the mixers' norms), and it
    is refused with one line under any other norm (it would be ignored silently)."""
    from attnlab.errors import UserError
    from attnlab.models.classifier import ClassifierConfig, TextClassifier
    from attnlab.models.gpt import GPT, GPTConfig
    from attnlab.models.mae import MAE, MAEConfig
    from attnlab.models.seq2seq import Seq2SeqConfig, Seq2SeqTransformer
    from attnlab.models.swin import Swin, SwinConfig
    from attnlab.models.vit import ViT, ViTConfig

    alpha0 = float(torch.empty(()).uniform_(0.6, 8.0))
    gpt = dict(vocab_size=11, context=8, n_layers=2, n_heads=2, d_model=8)
    vit = dict(image_size=8, patch_size=4, d_model=8, n_heads=2, n_layers=1)
    swin = dict(image_size=8, patch_size=2, d_model=4, depths=(1, 1), stage_heads=(1, 2), window=2)
    cases = [
        (GPT, GPTConfig, gpt),
        (GPT, GPTConfig, {**gpt, "mixer": "hybrid", "attn_every": 2}),
        (GPT, GPTConfig, {**gpt, "mixer": "rwkv"}),
        (ViT, ViTConfig, vit),
        (Swin, SwinConfig, swin),
        (MAE, MAEConfig, dict(image_size=8, patch_size=4, d_model=8, n_heads=2, n_layers=1)),
        (TextClassifier, ClassifierConfig, dict(vocab_size=11, d_model=8, n_heads=2)),
        (Seq2SeqTransformer, Seq2SeqConfig, dict(src_vocab_size=9, tgt_vocab_size=9, d_model=8)),
    ]
    for model_cls, cfg_cls, kwargs in cases:
        model = model_cls(cfg_cls(**kwargs, norm="dyt", dyt_alpha0=alpha0))
        alphas = [m.alpha.item() for m in model.modules() if isinstance(m, DyT)]
        assert alphas and all(a == pytest.approx(alpha0) for a in alphas), (cfg_cls, alphas)
        default = model_cls(cfg_cls(**kwargs, norm="dyt"))
        assert all(m.alpha.item() == 0.5 for m in default.modules() if isinstance(m, DyT))
        with pytest.raises(UserError, match="dyt_alpha0=.* only applies to norm='dyt'"):
            cfg_cls(**kwargs, norm="layer", dyt_alpha0=alpha0)


def test_a_stack_run_in_two_parts_is_the_whole_stack() -> None:
    """Blocks 0..stop-1, then stop.. from their output, equal the whole stack; the final norm
    comes only at the top (a pre-norm stack's LayerNorm)."""
    d, H, B, T, n = 16, 4, 2, 6, 3
    enc = (
        BlockStack(
            [Block(BlockConfig(d, H, 32, norm_position="pre")) for _ in range(n)], nn.LayerNorm(d)
        )
        .double()
        .eval()
    )  # no dropout: the parts and the whole see the same computation
    x = torch.randn(B, T, d, dtype=F64)
    mask = from_key_padding_mask(checks_torch.right_padding(B, T))
    whole = enc(x, mask)
    for stop in range(n + 1):
        lower = enc(x, mask, stop=stop)
        by_hand = x
        for block in list(enc.blocks)[:stop]:
            by_hand, _ = block(by_hand, mask)
        torch.testing.assert_close(lower, enc.norm(by_hand) if stop == n else by_hand, **TIGHT)
        torch.testing.assert_close(enc(by_hand, mask, start=stop), whole, **TIGHT)
