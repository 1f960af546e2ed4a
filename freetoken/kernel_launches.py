"""How many device kernels each kernel-set call launches: the engine's host counters count by this table and the
cost model (sim/overhead.py) charges it. A root module without imports, so both sides read it without torch."""

# Triton kernels each kernel-set entry launches (freetoken/kernels): expert_ffn = gate_up, down, sum_pairs;
# attention = decode split + merge (1 token) or one flash-attention kernel (prefill); linear = one kernel, split-K
# decode included (its last split reduces in the same launch).
KERNEL_LAUNCHES = {"rms_norm": 1, "add_rms_norm": 1, "add_norm_linear": 1, "apply_rope": 1, "qk_norm_rope": 1,
                   "router_topk": 1, "router_linear_topk": 1, "linear": 1, "expert_ffn": 3,
                   "expert_ffn_quant": 3, "attention_decode": 2, "attention_prefill": 1,
                   "causal_conv1d": 1, "causal_conv1d_update": 1, "gated_delta_chunk": 1, "gated_delta_step": 1,
                   "rms_norm_gated": 1,
                   # DeepSeek-V4 (freetoken/engine/v4_*.py)
                   "router_weights": 1, "hc_pre": 1, "hc_post": 1, "hc_head": 1, "compress_pool": 1,
                   "attention_compressed": 1,
                   # device placement (engine/device_moe.py): one decision program per MoE call, one gather per
                   # two expert tensors (SlotPool.tensors_per_expert of them)
                   "place_call": 1, "gather_experts": 1, "moe_slots": 1,
                   "moe_union": 1}
# Linears of a plain attention layer (freetoken/engine/model.py): q, k and v fused into one projection, then o.
ATTENTION_LINEARS = 2
# Linears of a Gated DeltaNet layer (freetoken/engine/gated_deltanet.py): the fused qkv / z / b / a input projection, out.
DELTANET_LINEARS = 2
