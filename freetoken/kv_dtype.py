"""The KV cache's storage choices and what a token costs in each, in a root module that imports only
freetoken.choices (the CLI, the memory planner and the simulator read it without loading torch or the kernels).

auto: the model's dtype (the cache as it always was); bf16: bfloat16; fp8: e4m3 codes with one fp32 scale per
(token, kv head), quantized when the token's K/V are written (freetoken/kernels/kv_fp8.py).
"""

from freetoken.choices import check_one_of

KV_DTYPES = ("auto", "bf16", "fp8")
SCALE_BYTES = 4  # fp8: one fp32 scale per (token, kv head), for K and for V
KV_DTYPE_HELP = ("KV cache storage: auto (the model's dtype, the default), bf16, or fp8 (e4m3 with one fp32 scale "
                 "per token and kv head: Dh + 4 bytes per head instead of 2 Dh, so more expert slots fit)")


def check_kv_dtype(value: str, field: str = "--kv-dtype") -> str:
    return check_one_of(value, KV_DTYPES, field)


def kv_bytes_per_token(kv_rows: int, head_dim: int, kv_dtype: str, itemsize: int) -> int:
    """KV bytes one context token costs: kv_rows = (layers with KV) x kv heads, K and V each; itemsize: the model
    dtype's, used by auto."""
    per_row = {"auto": head_dim * itemsize, "bf16": head_dim * 2, "fp8": head_dim + SCALE_BYTES}[check_kv_dtype(kv_dtype)]
    return 2 * kv_rows * per_row
