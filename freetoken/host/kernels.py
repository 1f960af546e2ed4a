"""The host kernels' Python side: the C library's entry points over torch tensors, each beside its torch reference.

    out = moe(mats, x, ids, weights, take)          # one MoE layer's taken experts, all tokens: fp32 [T, D]
    y = linear(x, w, bias)                          # dense projection of a few rows, in the weights' dtype
    o = attention_decode(q, ks, vs, lengths, scale) # one query per sequence against its own KV cache
    o = attention_step(qkv, ...)                    # a decode token's q / k norms, rope, KV write and attention
    rms_norm, rope, softmax_topk                    # a decode step's small ops, one call each

threads: set_threads(n) (the engine's --threads; default the physical cores); torch's intra-op threads are set to
the same number by the engine, so both kinds of host work use the same cores. generic=True runs the portable path
(what CPUs without AVX512-BF16 run) on any machine.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from freetoken.host import build
from freetoken.host.native import (AttnArgs, LinearArgs, Matrix, MoEArgs, StepArgs, GLU_KINDS, FP8, act_kind, check,
                                   declare, dense_matrix, packed_matrix, ptr)
from freetoken.quant.packed import PackedWeight

_THREADS = [0]
_INT8_ACTS: list[bool | None] = [None]  # None: FT_HOST_INT8_ACTS (default on), read at first use
ROW_PREFETCH_INTEL = 4096  # row_prefetch()'s auto choice on Intel (2 KB: slower on every shape; 8 KB: on the int8 head)
ROW_PREFETCH_AMD_AVX2 = 1024  # on AMD without AVX-512 (Zen 3: 512 B as none, 2-4 KB slower than none)


def physical_cores(cpuinfo: str | None = None) -> int:
    """Distinct (physical id, core id) pairs of /proc/cpuinfo (or the text given); os.cpu_count() where it has none.
    SMT siblings share one core's FMA units and memory port: a bandwidth-bound expert GEMV gains nothing from them."""
    import os
    from pathlib import Path

    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text() if path.is_file() else ""
    cores, package = set(), "0"
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "physical id":
            package = value.strip()
        elif name == "core id":
            cores.add((package, value.strip()))
    return len(cores) or os.cpu_count() or 1


def set_threads(n: int | None) -> int:
    """Threads every host kernel uses (None: the physical cores); returns the number set."""
    if n is not None and n <= 0:
        raise ValueError(f"threads must be positive, got {n}")
    _THREADS[0] = n or physical_cores()
    return _THREADS[0]


def threads() -> int:
    return _THREADS[0] or set_threads(None)


_LIBS: dict[bool, ctypes.CDLL | None] = {}


AVX2 = "avx2"  # moe / linear(generic=AVX2): the portable build's own fast paths (path Q on AVX2 where the CPU has it)


def _generic_flag(generic: bool | str) -> int:
    """The kernels' `generic` argument: 0 native paths, 1 path B only, 2 the portable build's AVX2 paths (so a CPU
    with AVX-512 runs the code that CPUs without it take)."""
    return 2 if generic == AVX2 else int(bool(generic))


def library(generic: bool | str = False) -> ctypes.CDLL | None:
    generic = bool(generic)
    lib = _LIBS.get(generic)
    if lib is None and generic not in _LIBS:
        lib = build.load("generic" if generic else "native")
        if lib is not None:
            declare(lib)
            lib.ft_set_int8_acts(int(int8_acts()))
            lib.ft_set_row_prefetch(row_prefetch())
        _LIBS[generic] = lib
    return lib


def row_prefetch(cpuinfo: str | None = None) -> int:
    """Bytes ahead that bf16 and int8 weight rows are prefetched in software at decode ($FT_HOST_ROW_PREFETCH: a
    byte count, 0 / off, or auto, the default: the CPU decides). On Intel Xeons the hardware prefetcher alone left
    one thread's row streams at 70-85% of the read bandwidth and 4 KB ahead brought them to 95-105%; on AMD Zen 4
    (AVX-512) it made int8 rows slower and bf16 rows did not need it; on AMD Zen 3 (AVX2 only) 1 KB ahead made bf16
    decode 4-9% faster and int8 / bf16 heads 4-5% (docs/host.md)."""
    import os

    value = os.environ.get("FT_HOST_ROW_PREFETCH", "auto").strip().lower()
    if value in ("off", "0"):
        return 0
    if value != "auto":
        if not value.isdigit() or int(value) % 64:
            raise ValueError(f"FT_HOST_ROW_PREFETCH={value!r}: use auto (the default), off, or a byte count that "
                             "is a multiple of 64")
        return int(value)
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return 0
    if "GenuineIntel" in cpuinfo:
        return ROW_PREFETCH_INTEL
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "").split()
    return ROW_PREFETCH_AMD_AVX2 if "AuthenticAMD" in cpuinfo and "avx512f" not in flags else 0


def set_row_prefetch(nbytes: int) -> None:
    """Sets row_prefetch()'s choice for the loaded libraries (0: none); for measuring both ways in one process."""
    for lib in _LIBS.values():
        if lib is not None:
            lib.ft_set_row_prefetch(int(nbytes))


def int8_acts() -> bool:
    """Whether int4 weights meet int8 activations (set_int8_acts, else $FT_HOST_INT8_ACTS: 1 / on (default), 0 / off)."""
    if _INT8_ACTS[0] is None:
        import os

        value = os.environ.get("FT_HOST_INT8_ACTS", "1").strip().lower()
        if value not in ("1", "on", "true", "0", "off", "false"):
            raise ValueError(f"FT_HOST_INT8_ACTS={value!r}: use 1 / on (int8 activations for int4 weights, the "
                             "default) or 0 / off (bf16 activations)")
        _INT8_ACTS[0] = value in ("1", "on", "true")
    return bool(_INT8_ACTS[0])


def set_int8_acts(on: bool) -> None:
    """int4 weights against int8 activations (AVX512-VNNI or AVX2, per unit of min(group, 128) columns:
    int8_acts_ref; the default where the CPU has either) or bf16 ones (path A: exact products, instruction-bound on
    int4)."""
    _INT8_ACTS[0] = bool(on)
    for lib in _LIBS.values():
        if lib is not None:
            lib.ft_set_int8_acts(int(on))


def int8_acts_ref(x: torch.Tensor, unit: int) -> torch.Tensor:
    """x [T, K] as path Q reads it, in fp32: per unit of `unit` columns d = max|x| / 127, a = round(x / d) (ties to
    even), x ~ a * d. The int4 x int8 kernels equal the dequantized weights times this, up to summation order."""
    xf = x.float().reshape(x.shape[0], -1, unit)  # [T, units, unit]
    d = xf.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return ((xf * inv).round().clamp(-127, 127) * d).reshape(x.shape)


def int8_acts_unit(w, generic: bool | str = False) -> int | None:
    """The activation unit path Q uses for this weight on this machine (None: it reads bf16 activations);
    generic=AVX2: in the portable build's AVX2 path Q."""
    lib = library(generic)
    if generic == AVX2 and (lib is None or lib.ft_path_q_built() != 2):
        return None
    if lib is None or not int8_acts() or not isinstance(w, PackedWeight) or w.kind not in ("int4", "int8"):
        return None
    return lib.ft_path_q_unit(ctypes.byref(packed_matrix(w))) or None


def available() -> bool:
    lib = _LIBS.get(False)
    return lib is not None or (False not in _LIBS and library() is not None)


def unavailable_reason() -> str | None:
    return build.unavailable_reason("native")


def path_a() -> bool:
    """Whether the native library carries the AVX512-BF16 path (this CPU has it and the compiler targets it)."""
    lib = library()
    return lib is not None and bool(lib.ft_caps())


def path_q() -> str | None:
    """The instruction set int4 weights meet int8 activations with here ("AVX512-VNNI" or "AVX2"; None: no path Q
    built, or FT_HOST_INT8_ACTS off)."""
    lib = library()
    isa = lib.ft_path_q_built() if lib is not None and int8_acts() else 0
    return {1: "AVX512-VNNI", 2: "AVX2"}.get(isa)


# MoE layer
@dataclass(slots=True)
class MoEMatrices:
    """One MoE layer's experts as the C kernels read them: gate [E, I, D], up [E, I, D], down [E, D, I] descriptors
    (dense: the two halves of the store's gate_up rows), the gated activation, fp32 biases or None."""
    gate: Matrix
    up: Matrix
    down: Matrix
    experts: int
    glu: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0
    b_gate_up: torch.Tensor | None = None  # [E, 2I] fp32
    b_down: torch.Tensor | None = None  # [E, D] fp32
    keep: tuple = ()  # the tensors the descriptors point into
    args: MoEArgs | None = None  # the call's arguments, built once; each call sets its tensors

    @classmethod
    def dense(cls, gate_up: torch.Tensor, down: torch.Tensor, **kw) -> MoEMatrices:
        """gate_up [E, 2I, D] (gate rows, then up rows), down [E, D, I]: the store's or a slot pool's tensors."""
        I = down.shape[-1]
        return cls(dense_matrix(gate_up, 0, I), dense_matrix(gate_up, I, I), dense_matrix(down), gate_up.shape[0],
                   keep=(gate_up, down), **kw)


def moe_args(m: MoEMatrices) -> MoEArgs:
    """The layer's call arguments, built once; each call sets its tensors."""
    if m.args is None:
        m.args = MoEArgs(ctypes.pointer(m.gate), ctypes.pointer(m.up), ctypes.pointer(m.down), ptr(m.b_gate_up),
                         ptr(m.b_down), GLU_KINDS[m.glu], m.alpha, m.limit, E=m.experts)
    return m.args


def moe(m: MoEMatrices, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, take: torch.Tensor | None,
        generic: bool | str = False, out: torch.Tensor | None = None, cast: bool = False) -> torch.Tensor:
    """x [T, D] (fp32 / bf16 / fp16), ids [T, K] int32 (any id not taken is skipped), weights [T, K] fp32, take [E]
    uint8 (None: every expert) -> fp32 [T, D]: sum over each token's taken picks of w * down(glu(gate x, up x));
    cast: that sum rounded to x's dtype instead (one rounding, in the kernel)."""
    lib = library(generic)
    T, K = ids.shape
    x, ids, weights = x.contiguous(), ids.contiguous(), weights.contiguous()
    take = None if take is None else take.contiguous()
    rounded = torch.empty(T, m.down.rows, dtype=x.dtype) if cast else None
    if out is None and not cast:
        out = torch.empty(T, m.down.rows, dtype=torch.float32)
    args = moe_args(m)
    args.x, args.x_kind, args.T, args.ids, args.weights, args.K = (x.data_ptr(), act_kind(x.dtype), T, ids.data_ptr(),
                                                                  weights.data_ptr(), K)
    args.take, args.out, args.threads, args.generic = ptr(take), ptr(out), threads(), _generic_flag(generic)
    args.out_cast, args.out_kind = ptr(rounded), args.x_kind
    check(lib.ft_moe(ctypes.byref(args)), "moe")
    return out if rounded is None else rounded


def moe_ref(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, take: torch.Tensor, gate: torch.Tensor,
            up: torch.Tensor, down: torch.Tensor, b_gate_up: torch.Tensor | None = None,
            b_down: torch.Tensor | None = None, glu: str = "silu", alpha: float = 1.702,
            limit: float = 7.0, units: tuple[int | None, int | None] = (None, None)) -> torch.Tensor:
    """moe's contract in torch: gate / up [E, I, D], down [E, D, I] in fp32 (dequantized), everything in fp32, the
    gated activation rounded to x's dtype before the down projection; units: (gate / up, down) activation units of
    int4 x int8 matrices (int8_acts_unit), whose inputs are read as int8_acts_ref."""
    from freetoken.kernels.expert_ffn import glu_ref

    T, K = ids.shape
    I = gate.shape[1]
    out = torch.zeros(T, down.shape[1], dtype=torch.float32)
    xf = x.float() if units[0] is None else int8_acts_ref(x, units[0])
    for t in range(T):
        for k in range(K):
            e = int(ids[t, k])
            if e < 0 or e >= take.numel() or not take[e]:
                continue
            g, u = gate[e] @ xf[t], up[e] @ xf[t]
            if b_gate_up is not None:
                g, u = g + b_gate_up[e, :I].float(), u + b_gate_up[e, I:].float()
            h = glu_ref(g, u, glu, alpha, limit).to(x.dtype).float()
            if units[1] is not None:
                h = int8_acts_ref(h[None], units[1])[0]
            y = down[e] @ h
            if b_down is not None:
                y = y + b_down[e].float()
            out[t] += weights[t, k].float() * y
    return out


# dense projection
_LINEARS: dict[tuple, LinearArgs] = {}  # per (weight, bias): the call's arguments, built once


def linear_args(w, bias: torch.Tensor | None) -> LinearArgs:
    """The projection's call arguments, built once per (weight, bias); each call sets its tensors. They hold what
    they point into (`keep`), so a caller may keep them past the cache's clearing."""
    packed = isinstance(w, PackedWeight)
    key = ((w.data if packed else w).data_ptr(), w.shape, None if bias is None else bias.data_ptr())
    got = _LINEARS.get(key)
    if got is None:
        if len(_LINEARS) > 4096:
            _LINEARS.clear()
        m = packed_matrix(w) if packed else dense_matrix(w)
        b = None if bias is None else bias.float().contiguous()
        args = LinearArgs(ctypes.pointer(m), ptr(b))
        args.keep = (m, b, w, bias)
        got = _LINEARS[key] = args
    return got


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None, generic: bool | str = False) -> torch.Tensor:
    """x [T, K], w [N, K] (fp32 / bf16 / fp16 rows, or a one-slot PackedWeight read as stored), bias [N] -> [T, N]
    in x's dtype, accumulated in fp32: each thread streams a slice of w's rows once for every row of x."""
    lib = library(generic)
    T = x.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(T, w.shape[0], dtype=x.dtype)  # (sizes as ints: torch parses a tuple slower)
    args = linear_args(w, bias)
    kind = act_kind(x.dtype)
    args.x, args.x_kind, args.T, args.x_stride = x.data_ptr(), kind, T, x.stride(0)
    args.out, args.out_kind, args.out_stride, args.threads, args.generic = (out.data_ptr(), kind, out.shape[1],
                                                                            threads(), _generic_flag(generic))
    check(lib.ft_linear(ctypes.byref(args)), "linear")
    return out


# decode attention
_POINTER_ARRAYS: dict[tuple, object] = {}  # per tuple of addresses: the C array of them (a KV cache's are fixed)


def pointers(tensors: list[torch.Tensor]):
    """The tensors' data pointers as a C array (void **), made once per set of addresses."""
    addresses = tuple([t.data_ptr() for t in tensors])
    got = _POINTER_ARRAYS.get(addresses)
    if got is None:
        if len(_POINTER_ARRAYS) > 4096:
            _POINTER_ARRAYS.clear()
        got = _POINTER_ARRAYS[addresses] = ctypes.cast((ctypes.c_void_p * len(addresses))(*addresses),
                                                       ctypes.POINTER(ctypes.c_void_p))
    return got


def attention_decode(q: torch.Tensor, k_caches: list[torch.Tensor], v_caches: list[torch.Tensor],
                     lengths: list[int], sm_scale: float, sinks: torch.Tensor | None = None,
                     window: int | None = None, k_scales: list[torch.Tensor] | None = None,
                     v_scales: list[torch.Tensor] | None = None, generic: bool = False) -> torch.Tensor:
    """q [B, H, Dh]: sequence b's one query at position lengths[b] - 1 against k_caches[b], v_caches[b]
    [>= lengths[b], Hkv, Dh] (fp32 / bf16 / fp16, or uint8 e4m3 with k_scales / v_scales [>= len, Hkv]) -> [B, H, Dh]
    in q's dtype. Sinks [H] join the softmax denominator; window keeps the last `window` positions.
    generic: the portable build (its AVX2 form where the CPU has AVX2, what CPUs without AVX-512 run)."""
    lib = library(generic)
    B, H, Dh = q.shape
    q = q.contiguous()
    fp8 = k_caches[0].dtype == torch.uint8
    kv_kind = FP8 if fp8 else act_kind(k_caches[0].dtype)
    ks, vs = pointers(k_caches), pointers(v_caches)
    kss, vss = (pointers(k_scales), pointers(v_scales)) if fp8 else (None, None)
    lens = torch.tensor(lengths, dtype=torch.int32)
    s = None if sinks is None else sinks.float().contiguous()
    out = torch.empty_like(q)
    args = AttnArgs(B, H, k_caches[0].shape[1], Dh, q.data_ptr(), act_kind(q.dtype), ks, vs, kss, vss, kv_kind,
                    lens.data_ptr(), sm_scale, ptr(s), window or 0, out.data_ptr(), act_kind(out.dtype), threads())
    check(lib.ft_attention_decode(ctypes.byref(args)), "attention_decode")
    return out


# a decode step's small ops
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, round_normed: bool = True) -> torch.Tensor:
    """rms_norm_ref's contract: x [T, D] (rows contiguous) -> [T, D] in x's dtype."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    T, D = x.shape
    out = torch.empty(T, D, dtype=x.dtype)
    w = weight if weight.is_contiguous() else weight.contiguous()
    check(library().ft_rms_norm(x.data_ptr(), act_kind(x.dtype), x.stride(0), T, D, w.data_ptr(), act_kind(w.dtype),
                                eps, int(round_normed), out.data_ptr(), D, threads()), "rms_norm")
    return out


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, rotary_dim: int,
         scale: float = 1.0) -> torch.Tensor:
    """apply_rope_ref's contract: x [T, H, Dh] (last dim contiguous), positions [T] int64, inv_freq [rotary_dim / 2]
    fp32 -> a new contiguous [T, H, Dh] in x's dtype."""
    T, H, Dh = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    pos = positions if positions.dtype == torch.int64 and positions.is_contiguous() else \
        positions.to(torch.int64).contiguous()
    out = torch.empty(T, H, Dh, dtype=x.dtype)
    check(library().ft_rope(x.data_ptr(), act_kind(x.dtype), x.stride(0), x.stride(1), T, H, Dh, pos.data_ptr(),
                            inv_freq.data_ptr(), rotary_dim, scale, out.data_ptr(), threads()), "rope")
    return out


def softmax_topk(logits: torch.Tensor, k: int, renormalize: bool, scale: float = 1.0):
    """router_topk_ref's softmax routing without bias or groups: logits [T, E] -> (weights [T, K] fp32, ids [T, K]
    int32), the K largest probabilities first, ties to the lower id."""
    logits = logits.contiguous()
    T, E = logits.shape
    weights = torch.empty(T, k, dtype=torch.float32)
    ids = torch.empty(T, k, dtype=torch.int32)
    check(library().ft_softmax_topk(logits.data_ptr(), act_kind(logits.dtype), T, E, k, int(renormalize), scale,
                                    weights.data_ptr(), ids.data_ptr(), threads()), "softmax_topk")
    return weights, ids


@dataclass(slots=True)
class StepLayer:
    """What attention_step needs of one attention layer besides the token: head counts, the q / k RMSNorm weights
    (None: none; norm_full: over the whole projection, else per head), rope and softmax options."""
    heads: int
    kv_heads: int
    head_dim: int
    sm_scale: float
    inv_freq: torch.Tensor  # [rotary / 2] fp32
    rotary: int
    rope_scale: float = 1.0
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    norm_full: bool = False
    eps: float = 1e-6
    round_normed: bool = True
    sinks: torch.Tensor | None = None  # [H] fp32
    window: int | None = None
    args: StepArgs | None = None  # the call's arguments, built once; each call sets its tensors


def step_args(layer: StepLayer) -> StepArgs:
    """New call arguments for the layer (what a call sets, its tensors and positions, left unset)."""
    qn, kn = layer.q_norm, layer.k_norm
    return StepArgs(H=layer.heads, Hkv=layer.kv_heads, Dh=layer.head_dim, q_norm=ptr(qn), k_norm=ptr(kn),
                    norm_kind=act_kind(qn.dtype) if qn is not None else 0, norm_full=int(layer.norm_full),
                    eps=layer.eps, round_normed=int(layer.round_normed), inv_freq=layer.inv_freq.data_ptr(),
                    rotary=layer.rotary, rope_scale=layer.rope_scale, sm_scale=layer.sm_scale, sinks=ptr(layer.sinks),
                    window=layer.window or 0)


def attention_step(qkv: torch.Tensor, layer: StepLayer, positions: list[int], k_caches: list[torch.Tensor],
                   v_caches: list[torch.Tensor]) -> torch.Tensor:
    """qkv [B, (H + 2 Hkv) Dh] of B sequences' decode tokens (sequence b at positions[b]) -> attention [B, H, Dh]:
    q and k normed and roped, k and v written into k_caches[b] / v_caches[b] [>= pos + 1, Hkv, Dh] at positions[b]."""
    B = qkv.shape[0]
    H, Hkv, Dh = layer.heads, layer.kv_heads, layer.head_dim
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    q_buf = torch.empty(B, H, Dh, dtype=qkv.dtype)  # scratch for q
    out = torch.empty(B, H, Dh, dtype=qkv.dtype)
    args = layer.args
    if args is None:
        args = layer.args = step_args(layer)
    pos = (ctypes.c_int64 * B)(*positions)
    args.B, args.qkv, args.kind, args.qkv_stride = B, qkv.data_ptr(), act_kind(qkv.dtype), qkv.stride(0)
    args.positions, args.k_cache, args.v_cache = ctypes.addressof(pos), pointers(k_caches), pointers(v_caches)
    args.kv_kind, args.q_buf, args.out, args.threads = (act_kind(k_caches[0].dtype), q_buf.data_ptr(),
                                                        out.data_ptr(), threads())
    check(library().ft_attention_step(ctypes.byref(args)), "attention_step")
    return out
