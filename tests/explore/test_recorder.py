"""record_attention: what it records equals PyTorch's nn.MultiheadAttention, call by call."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attnlab.layers import attention_record
from attnlab.layers.attention import MultiHeadAttention, causal_mask, from_key_padding_mask
from attnlab.layers.attention_record import is_recording, record_attention
from attnlab.verify.copy_weights import copy_links, mha_links


def _pair(d: int, h: int) -> tuple[MultiHeadAttention, nn.MultiheadAttention]:
    ours = MultiHeadAttention(d, h).double().eval()
    theirs = nn.MultiheadAttention(d, h, batch_first=True).double().eval()
    copy_links(mha_links(ours, theirs))
    return ours, theirs


@pytest.mark.parametrize("causal", [False, True])
def test_recorded_weights_scores_and_mask_match_pytorch(causal: bool) -> None:
    B, T, D, H = 3, 7, 16, 4
    ours, theirs = _pair(D, H)
    x = torch.randn(B, T, D, dtype=torch.float64)
    lengths = torch.tensor([7, 4, 6])
    key_padding = torch.arange(T)[None, :] >= lengths[:, None]  # (B, T) True = ignore
    attn_mask = ~causal_mask(T)[0, 0] if causal else None  # (T, T) True = blocked
    _, want = theirs(
        x, x, x, key_padding_mask=key_padding, attn_mask=attn_mask, average_attn_weights=False
    )  # (B, H, T, T)
    with record_attention(ours) as rec:
        ours(x, mask=from_key_padding_mask(key_padding), is_causal=causal)
    (call,) = rec.calls
    assert call.module == ""  # the root module's name
    torch.testing.assert_close(call.weights, want, rtol=0, atol=1e-12)
    # scores are the raw q·kᵀ: softmax(scores / sqrt(d_k)), masked, gives the weights again
    assert call.scale == pytest.approx(1 / math.sqrt(D // H))
    keep = from_key_padding_mask(key_padding) & (causal_mask(T) if causal else True)
    assert torch.equal(call.mask.expand(B, H, T, T), keep.expand(B, H, T, T))
    assert call.is_causal is causal
    logits = (call.scores * call.scale).masked_fill(~keep, float("-inf"))
    torch.testing.assert_close(torch.softmax(logits, -1), want, rtol=0, atol=1e-12)
    # and q·kᵀ itself, from the projection weights of nn.MultiheadAttention
    w_q, w_k, _ = theirs.in_proj_weight.chunk(3)
    b_q, b_k, _ = theirs.in_proj_bias.chunk(3)
    q = (x @ w_q.T + b_q).view(B, T, H, -1).transpose(1, 2)  # (B, H, T, Dh)
    k = (x @ w_k.T + b_k).view(B, T, H, -1).transpose(1, 2)
    torch.testing.assert_close(call.scores, q @ k.transpose(-2, -1), rtol=0, atol=1e-10)


def test_recorder_names_modules_keeps_call_order_and_stops_on_exit() -> None:
    model = nn.ModuleDict({"first": MultiHeadAttention(8, 2), "second": MultiHeadAttention(8, 2)})
    x = torch.randn(2, 5, 8)
    assert not is_recording()
    with record_attention(model) as rec:
        assert is_recording()
        model["second"](x)
        model["first"](x)
        with pytest.raises(ValueError, match="already active"):
            record_attention().__enter__()
    assert [c.module for c in rec.calls] == ["second", "first"]
    assert not is_recording() and attention_record._ACTIVE is None
    model["first"](x)  # nothing recorded after the block, hooks removed
    assert len(rec.calls) == 2


def test_recorder_does_not_change_outputs() -> None:
    mha = MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 6, 16)
    plain, _ = mha(x, is_causal=True)
    with record_attention(mha):
        recorded, _ = mha(x, is_causal=True)
    torch.testing.assert_close(recorded, plain, rtol=1e-5, atol=1e-6)
