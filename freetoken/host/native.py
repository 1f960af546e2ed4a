"""ctypes mirrors of csrc/ftk.h and the descriptors of torch tensors / PackedWeights the C kernels read in place.

A descriptor holds raw pointers: whoever keeps it keeps the tensors alive (HostExperts keeps the store's layers)."""

from __future__ import annotations

import ctypes

import torch

from freetoken.quant.packed import PackedWeight

F32, BF16, F16, INT4, FP4, FP8, INT8 = range(7)
SC_NONE, SC_F32, SC_BF16, SC_F16, SC_E8M0, SC_E4M3 = range(6)
GLU_KINDS = {"silu": 0, "clamped": 1, "silu_limit": 2}
GLOBAL_OPS = {None: 0, "divide": 1, "multiply": 2}
DENSE_KINDS = {torch.float32: F32, torch.bfloat16: BF16, torch.float16: F16}
SCALE_KINDS = {torch.float32: SC_F32, torch.bfloat16: SC_BF16, torch.float16: SC_F16}
ERRORS = {-1: "unsupported weight format", -2: "mismatched shapes", -3: "out of memory"}

_p = ctypes.c_void_p
_i32, _i64, _f32 = ctypes.c_int32, ctypes.c_int64, ctypes.c_float


class Matrix(ctypes.Structure):
    _fields_ = [("kind", _i32), ("rows", _i32), ("cols", _i32), ("group", _i32), ("block_rows", _i32),
                ("scale_kind", _i32), ("scale_cols", _i32), ("global_op", _i32),
                ("data", _p), ("scales", _p), ("zeros", _p), ("g_idx", _p), ("global_scale", _p),
                ("data_stride", _i64), ("scales_stride", _i64), ("zeros_stride", _i64), ("g_idx_stride", _i64),
                ("row_bytes", _i64)]


class MoEArgs(ctypes.Structure):
    _fields_ = [("gate", ctypes.POINTER(Matrix)), ("up", ctypes.POINTER(Matrix)), ("down", ctypes.POINTER(Matrix)),
                ("b_gate_up", _p), ("b_down", _p), ("glu", _i32), ("alpha", _f32), ("limit", _f32),
                ("x", _p), ("x_kind", _i32), ("T", _i32), ("ids", _p), ("weights", _p), ("K", _i32),
                ("take", _p), ("E", _i32), ("out", _p), ("out_cast", _p), ("out_kind", _i32), ("threads", _i32),
                ("generic", _i32)]


class LinearArgs(ctypes.Structure):
    _fields_ = [("w", ctypes.POINTER(Matrix)), ("bias", _p), ("x", _p), ("x_kind", _i32), ("T", _i32),
                ("x_stride", _i64), ("out", _p), ("out_kind", _i32), ("out_stride", _i64), ("threads", _i32),
                ("generic", _i32)]


class AttnArgs(ctypes.Structure):
    _fields_ = [("B", _i32), ("H", _i32), ("Hkv", _i32), ("Dh", _i32), ("q", _p), ("q_kind", _i32),
                ("k", ctypes.POINTER(_p)), ("v", ctypes.POINTER(_p)), ("k_scale", ctypes.POINTER(_p)),
                ("v_scale", ctypes.POINTER(_p)), ("kv_kind", _i32), ("len", _p), ("sm_scale", _f32),
                ("sinks", _p), ("window", _i32), ("out", _p), ("out_kind", _i32), ("threads", _i32)]


class StepArgs(ctypes.Structure):
    _fields_ = [("B", _i32), ("H", _i32), ("Hkv", _i32), ("Dh", _i32), ("qkv", _p), ("kind", _i32), ("qkv_stride", _i64),
                ("q_norm", _p), ("k_norm", _p), ("norm_kind", _i32), ("norm_full", _i32), ("eps", _f32),
                ("round_normed", _i32), ("positions", _p), ("inv_freq", _p), ("rotary", _i32), ("rope_scale", _f32),
                ("k_cache", ctypes.POINTER(_p)), ("v_cache", ctypes.POINTER(_p)), ("kv_kind", _i32),
                ("sm_scale", _f32), ("sinks", _p), ("window", _i32), ("q_buf", _p), ("out", _p), ("threads", _i32)]


class DecodeLayer(ctypes.Structure):
    _fields_ = [("qkv", ctypes.POINTER(LinearArgs)), ("o", ctypes.POINTER(LinearArgs)),
                ("router", ctypes.POINTER(LinearArgs)), ("attn", ctypes.POINTER(StepArgs)),
                ("moe", ctypes.POINTER(MoEArgs)), ("input_norm", _p), ("post_norm", _p), ("ids", _p), ("weights", _p)]


class DecodeArgs(ctypes.Structure):
    _fields_ = [("B", _i32), ("L", _i32), ("D", _i32), ("E", _i32), ("K", _i32), ("kind", _i32), ("norm_kind", _i32),
                ("round_normed", _i32), ("renormalize", _i32), ("eps", _f32), ("route_scale", _f32),
                ("layers", ctypes.POINTER(DecodeLayer)), ("x", _p), ("y", _p), ("h", _p), ("qkv", _p), ("q_buf", _p),
                ("attn", _p), ("logits", _p), ("final_norm", _p), ("head", ctypes.POINTER(LinearArgs)), ("out", _p),
                ("threads", _i32)]


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    for name, arg in (("ft_moe", MoEArgs), ("ft_linear", LinearArgs), ("ft_attention_decode", AttnArgs),
                      ("ft_attention_step", StepArgs), ("ft_decode", DecodeArgs)):
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [ctypes.POINTER(arg)], ctypes.c_int
    lib.ft_caps.argtypes, lib.ft_caps.restype = [], ctypes.c_int
    lib.ft_set_int8_acts.argtypes, lib.ft_set_int8_acts.restype = [_i32], None
    lib.ft_set_row_prefetch.argtypes, lib.ft_set_row_prefetch.restype = [_i32], None
    lib.ft_path_q_built.argtypes, lib.ft_path_q_built.restype = [], ctypes.c_int
    lib.ft_path_q_unit.argtypes, lib.ft_path_q_unit.restype = [ctypes.POINTER(Matrix)], ctypes.c_int
    lib.ft_rms_norm.argtypes = [_p, _i32, _i64, _i32, _i32, _p, _i32, _f32, _i32, _p, _i64, _i32]
    lib.ft_rope.argtypes = [_p, _i32, _i64, _i64, _i32, _i32, _i32, _p, _p, _i32, _f32, _p, _i32]
    lib.ft_softmax_topk.argtypes = [_p, _i32, _i32, _i32, _i32, _i32, _f32, _p, _p, _i32]
    for fn in (lib.ft_rms_norm, lib.ft_rope, lib.ft_softmax_topk):
        fn.restype = ctypes.c_int
    return lib


def check(code: int, what: str) -> None:
    if code != 0:
        raise RuntimeError(f"host kernel {what}: {ERRORS.get(code, f'error {code}')}")


def act_kind(dtype: torch.dtype) -> int:
    try:
        return DENSE_KINDS[dtype]
    except KeyError:
        raise ValueError(f"host kernels take fp32 / bf16 / fp16 activations, got {dtype}") from None


def _stride_bytes(t: torch.Tensor) -> int:
    return t.stride(0) * t.element_size() if t.dim() > 2 else 0


def dense_matrix(w: torch.Tensor, row_start: int = 0, rows: int | None = None) -> Matrix:
    """w [E, N, K] (or [N, K]: one expert) of fp32 / bf16 / fp16, rows [row_start, row_start + rows) of each."""
    if w.dtype not in DENSE_KINDS:
        raise ValueError(f"host kernels read fp32 / bf16 / fp16 dense weights, got {w.dtype}")
    if w.stride(-1) != 1 or (w.dim() > 2 and w.stride(-2) != w.shape[-1]):
        raise ValueError("host kernels need rows of contiguous weights")
    N, K = w.shape[-2:]
    es = w.element_size()
    return Matrix(kind=DENSE_KINDS[w.dtype], rows=N - row_start if rows is None else rows, cols=K,
                  data=w.data_ptr() + row_start * K * es, data_stride=_stride_bytes(w), row_bytes=K * es)


def packed_matrix(w: PackedWeight) -> Matrix:
    """A PackedWeight [S, N, ...] as stored (freetoken/quant/packed.py): nothing repacked, nothing copied."""
    N, K = w.shape
    m = Matrix(rows=N, cols=K, data=w.data.data_ptr(), data_stride=_stride_bytes(w.data),
               scales=w.scales.data_ptr(), scales_stride=_stride_bytes(w.scales), scale_cols=w.scales.shape[-1])
    if w.kind in ("int4", "int8"):
        if w.scales.dtype not in SCALE_KINDS:
            raise ValueError(f"{w.kind} scales of dtype {w.scales.dtype} are not read by the host kernels")
        m.kind, m.group, m.scale_kind = (INT4 if w.kind == "int4" else INT8), w.group, SCALE_KINDS[w.scales.dtype]
        m.row_bytes = K // 2 if w.kind == "int4" else K
        m.zeros, m.zeros_stride = w.zeros.data_ptr(), _stride_bytes(w.zeros)
        if w.g_idx is not None:
            m.g_idx, m.g_idx_stride = w.g_idx.data_ptr(), w.g_idx.stride(0)
    elif w.kind == "fp4":
        m.kind, m.group, m.row_bytes = FP4, w.group, K // 2
        m.scale_kind = SC_E8M0 if w.scale_code == "e8m0" else SC_E4M3
        m.global_op = GLOBAL_OPS[w.global_op]
        if w.global_scale is not None:
            m.global_scale = w.global_scale.data_ptr()
    else:  # fp8
        b0, b1 = w.block
        m.kind, m.group, m.block_rows, m.scale_kind, m.row_bytes = FP8, min(b1, K), min(b0, N), SC_F32, K
        if w.scales.dtype != torch.float32:
            raise ValueError(f"fp8 scales of dtype {w.scales.dtype} are not read by the host kernels")
    return m


def ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()
