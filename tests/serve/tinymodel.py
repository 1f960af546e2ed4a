"""A tiny random Qwen3-MoE checkpoint with a character-level tokenizer, written to a directory in well under a second.

Character-level tokens make text round-trip to the same ids, so a conversation's next turn re-tokenizes the
previous answer exactly as it was generated (what the prefix-cache test relies on).
"""

from __future__ import annotations

import string
from pathlib import Path

from freetoken.serve.chat import FALLBACK_TEMPLATE

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHARS = list(string.ascii_letters + string.digits + string.punctuation + " \n")


HYBRID = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
              linear_conv_kernel_dim=4, full_attention_interval=2, shared_expert_intermediate_size=16)
LATENT = dict(q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=8,
              n_shared_experts=1, first_k_dense_replace=0, n_group=1, topk_group=1, intermediate_size=32)
KINDS = {  # model type -> its fields beyond the shared shape
    "qwen3_moe": ("qwen3_moe", dict(intermediate_size=64)),
    "qwen3_5_moe": ("qwen3_5_moe_text", HYBRID),
    "deepseek_v3": ("deepseek_v3", dict(LATENT, num_key_value_heads=4)),  # MLA
    "glm_moe_dsa": ("glm_moe_dsa", dict(LATENT, num_key_value_heads=4, index_topk=4, index_head_dim=8,
                                        index_n_heads=2, indexer_types=["full", "shared"])),  # DSA
    "deepseek_v4": ("deepseek_v4", dict(num_key_value_heads=1, head_dim=16, q_lora_rank=16, n_routed_experts=8,
                                        sliding_window=4, o_groups=2, o_lora_rank=8, index_n_heads=8, index_head_dim=8,
                                        index_topk=2, hc_mult=2, partial_rotary_factor=0.25,
                                        compress_rates={"compressed_sparse_attention": 4,
                                                        "heavily_compressed_attention": 8},
                                        layer_types=["compressed_sparse_attention", "heavily_compressed_attention"],
                                        mlp_layer_types=["hash_moe", "moe"])),
}


def write_tiny_model(path: Path, seed: int = 0, max_context: int = 1024, hybrid: bool = False,
                     kind: str = "qwen3_moe") -> Path:
    """A checkpoint directory both the engine and transformers load. kind: a KINDS model (hybrid: "qwen3_5_moe",
    a Gated DeltaNet layer then a gated-attention layer)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIALS)
    fast.chat_template = FALLBACK_TEMPLATE  # ChatML with Hermes-style tools
    path.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(path)
    shape = dict(vocab_size=len(vocab), hidden_size=32, moe_intermediate_size=16, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2,
                 max_position_embeddings=max_context, eos_token_id=vocab["<|im_end|>"], pad_token_id=0,
                 tie_word_embeddings=False)
    model_type, extra = KINDS["qwen3_5_moe" if hybrid else kind]
    cfg = AutoConfig.for_model(model_type, **{**shape, **extra})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    for name, table in model.named_buffers():  # DeepSeek-V4's hash layers: HF starts every token at expert 0
        if name.endswith("tid2eid"):
            table.copy_(torch.stack([torch.randperm(8)[:2] for _ in range(table.shape[0])]))
    model.save_pretrained(path)
    return path
