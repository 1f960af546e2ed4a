"""Routing traces: which experts every token picked at every MoE layer.

One safetensors file per trace. Tensors (T = tokens, L = MoE layers, K = top-k):
    experts [T, L, K] int16   expert ids, in the router's top-k order
    gates   [T, L, K] float16 optional router weights of those experts
    request [T] int32         request id (a conversation / prompt)
    turn    [T] int32         turn within the request (agent workloads)
    phase   [T] int8          0 = prefill, 1 = decode
    token   [T] int32         token id, -1 where unknown
    hint    [T, L, K] int16   optional: the live router hint's predicted experts of each layer (layer l + 1's
                              router on layer l's hidden state), -1 where none was made (layer 0 always)
    draft   [T] int8          optional: speculative decoding's verify calls. 0: a plain token (a verify call starts
                              with one), 1: a drafted token the model accepted, 2: one it rejected (routed by the
                              verify call, then dropped). A decode token marked 0 and the 1 / 2 tokens after it
                              form one call of d + 1 tokens
String metadata: model, num_layers, num_experts, top_k, source, format_version (+ free-form extras).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from freetoken.io import atomic_path

FORMAT_VERSION = "1"
MAX_EXPERTS = int(np.iinfo(np.int16).max) + 1  # ids are int16: 0 .. 32767
PREFILL, DECODE = 0, 1
REQUIRED_META = ("model", "num_layers", "num_experts", "top_k", "source", "format_version")
_DTYPES = {
    "experts": np.int16,
    "gates": np.float16,
    "request": np.int32,
    "turn": np.int32,
    "phase": np.int8,
    "token": np.int32,
}


class TraceError(ValueError):
    """A trace file or array that does not satisfy the format; the message names the file and field."""


DUP_CHECK_VALUES = 1 << 20  # expert ids sorted at a time when checking top-k rows for repeats


@dataclass(slots=True)
class RoutingTrace:
    experts: np.ndarray  # [T, L, K] int16
    num_experts: int
    model: str = "unknown"
    source: str = "unknown"
    request: np.ndarray | None = None  # [T] int32
    turn: np.ndarray | None = None  # [T] int32
    phase: np.ndarray | None = None  # [T] int8
    token: np.ndarray | None = None  # [T] int32
    gates: np.ndarray | None = None  # [T, L, K] float16
    hint: np.ndarray | None = None  # [T, L, K] int16, -1: no prediction
    draft: np.ndarray | None = None  # [T] int8: 0 plain, 1 accepted draft, 2 rejected draft
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        T = self.experts.shape[0] if self.experts.ndim == 3 else 0
        if self.request is None:
            self.request = np.zeros(T, np.int32)
        if self.turn is None:
            self.turn = np.zeros(T, np.int32)
        if self.phase is None:
            self.phase = np.zeros(T, np.int8)
        if self.token is None:
            self.token = np.full(T, -1, np.int32)
        validate(self)

    # shape
    @property
    def num_tokens(self) -> int:
        return int(self.experts.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.experts.shape[1])

    @property
    def top_k(self) -> int:
        return int(self.experts.shape[2])

    @property
    def num_keys(self) -> int:
        """(layer, expert) pairs: the universe a cache of expert slots draws from."""
        return self.num_layers * self.num_experts

    def metadata(self) -> dict[str, str]:
        meta = dict(self.extra)
        meta.update(
            model=self.model,
            num_layers=str(self.num_layers),
            num_experts=str(self.num_experts),
            top_k=str(self.top_k),
            source=self.source,
            format_version=FORMAT_VERSION,
        )
        return meta

    def select(self, mask: np.ndarray) -> "RoutingTrace":
        """The tokens where mask is true (e.g. one request), same metadata."""
        return RoutingTrace(
            experts=self.experts[mask],
            num_experts=self.num_experts,
            model=self.model,
            source=self.source,
            request=self.request[mask],
            turn=self.turn[mask],
            phase=self.phase[mask],
            token=self.token[mask],
            gates=None if self.gates is None else self.gates[mask],
            hint=None if self.hint is None else self.hint[mask],
            draft=None if self.draft is None else self.draft[mask],
            extra=dict(self.extra),
        )


def _first_repeat(rows: np.ndarray, block: int = 1 << 16) -> int | None:
    """The first row of rows [N, K] holding a value twice, or None. Pairwise compares of contiguous columns, a block
    of rows at a time, into reused buffers: 5x faster than the compares on strided [N] views (28 against 138 ms for
    a 192K-token, 26-layer top-6 trace), several times faster than a sort along the short axis."""
    N, K = rows.shape
    cols = np.empty((K, min(block, N)), rows.dtype)  # [K, block]
    repeated, same = np.empty(cols.shape[1], bool), np.empty(cols.shape[1], bool)
    for a in range(0, N, block):
        n = min(N, a + block) - a
        np.copyto(cols[:, :n], rows[a:a + n].T)
        r, s = repeated[:n], same[:n]
        r[:] = False
        for i in range(K):
            for j in range(i + 1, K):
                np.equal(cols[i, :n], cols[j, :n], out=s)
                r |= s
        if r.any():
            return a + int(np.argmax(r))
    return None


def validate(trace: RoutingTrace, where: str = "trace") -> None:
    """Raise TraceError naming the field at fault; `where` is the file name when loading."""
    ex = trace.experts
    if not isinstance(ex, np.ndarray) or ex.ndim != 3:
        raise TraceError(f"{where}: field 'experts' must be a [tokens, layers, top_k] array, got "
                         f"{getattr(ex, 'shape', type(ex).__name__)}")
    if ex.dtype != np.int16:
        raise TraceError(f"{where}: field 'experts' must be int16, got {ex.dtype}")
    T, L, K = ex.shape
    if L == 0 or K == 0:
        raise TraceError(f"{where}: field 'experts' has an empty layer or top_k axis: shape {ex.shape}")
    if not isinstance(trace.num_experts, (int, np.integer)) or trace.num_experts <= 0:
        raise TraceError(f"{where}: metadata 'num_experts' must be a positive integer, got {trace.num_experts!r}")
    if trace.num_experts > MAX_EXPERTS:
        raise TraceError(f"{where}: metadata 'num_experts' is {trace.num_experts}; a trace holds expert ids as int16, "
                         f"so at most {MAX_EXPERTS} experts per layer")
    if K > trace.num_experts:
        raise TraceError(f"{where}: top_k {K} exceeds num_experts {trace.num_experts}")
    if T:
        lo, hi = int(ex.min()), int(ex.max())
        if lo < 0 or hi >= trace.num_experts:
            bad = lo if lo < 0 else hi
            t, l, k = np.argwhere(ex == bad)[0]
            raise TraceError(f"{where}: field 'experts' holds id {bad} at token {t}, layer {l}, slot {k}; "
                             f"ids must lie in [0, {trace.num_experts})")
        if K <= 16:
            row = _first_repeat(ex.reshape(T * L, K))
            if row is not None:
                raise TraceError(f"{where}: field 'experts' repeats an expert within one top-k at token {row // L}, "
                                 f"layer {row % L}")
        else:
            step = max(1, DUP_CHECK_VALUES // (L * K))  # tokens per block: a sorted copy of the whole trace would
            for a in range(0, T, step):  # double the peak memory of loading it
                s = np.sort(ex[a:a + step], axis=2)
                dup = np.argwhere(s[:, :, 1:] == s[:, :, :-1])
                if len(dup):
                    t, l, _ = dup[0]
                    raise TraceError(f"{where}: field 'experts' repeats an expert within one top-k at token {a + t}, "
                                     f"layer {l}")
    for name in ("request", "turn", "phase", "token"):
        arr = getattr(trace, name)
        if not isinstance(arr, np.ndarray) or arr.shape != (T,):
            raise TraceError(f"{where}: field '{name}' must have shape ({T},) to match 'experts', "
                             f"got {getattr(arr, 'shape', type(arr).__name__)}")
        if arr.dtype != _DTYPES[name]:
            raise TraceError(f"{where}: field '{name}' must be {np.dtype(_DTYPES[name])}, got {arr.dtype}")
    if T and not np.isin(trace.phase, (PREFILL, DECODE)).all():
        raise TraceError(f"{where}: field 'phase' must hold 0 (prefill) or 1 (decode)")
    if trace.gates is not None:
        g = trace.gates
        if not isinstance(g, np.ndarray) or g.shape != ex.shape:
            raise TraceError(f"{where}: field 'gates' must have the shape of 'experts' {ex.shape}, "
                             f"got {getattr(g, 'shape', None)}")
        if g.dtype != np.float16:
            raise TraceError(f"{where}: field 'gates' must be float16, got {g.dtype}")
    if trace.hint is not None:
        h = trace.hint
        if not isinstance(h, np.ndarray) or h.shape != ex.shape or h.dtype != np.int16:
            raise TraceError(f"{where}: field 'hint' must be int16 of the shape of 'experts' {ex.shape}, got "
                             f"{getattr(h, 'dtype', type(h).__name__)} {getattr(h, 'shape', None)}")
        if h.size and (int(h.min()) < -1 or int(h.max()) >= trace.num_experts):
            raise TraceError(f"{where}: field 'hint' holds ids outside [-1, {trace.num_experts})")
    if trace.draft is not None:
        d = trace.draft
        if not isinstance(d, np.ndarray) or d.shape != (T,) or d.dtype != np.int8:
            raise TraceError(f"{where}: field 'draft' must be int8 of shape ({T},), got "
                             f"{getattr(d, 'dtype', type(d).__name__)} {getattr(d, 'shape', None)}")
        if T and not np.isin(d, (0, 1, 2)).all():
            raise TraceError(f"{where}: field 'draft' must hold 0 (plain), 1 (accepted) or 2 (rejected draft)")


# files
def save(trace: RoutingTrace, path: str | os.PathLike) -> Path:
    """Write atomically: a failed save leaves no partial file behind."""
    from safetensors.numpy import save_file

    path = Path(path)
    validate(trace, str(path))
    tensors = {n: np.ascontiguousarray(getattr(trace, n)) for n in ("experts", "request", "turn", "phase", "token")}
    for name in ("gates", "hint", "draft"):
        if getattr(trace, name) is not None:
            tensors[name] = np.ascontiguousarray(getattr(trace, name))
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=trace.metadata())
        Path(tmp).write_bytes(canonical_header(Path(tmp).read_bytes()))
    return path


def canonical_header(blob: bytes) -> bytes:
    """The same safetensors bytes with the JSON header's keys sorted. safetensors writes its header from a hash map,
    so the key order (metadata and tensor entries) changes from one write to the next; sorted, the same trace is the
    same file byte for byte. Data offsets are relative to the end of the header, so the data block is unchanged."""
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes with spaces
    return len(text).to_bytes(8, "little") + text + blob[8 + n:]


def trace_file(path: str | os.PathLike, flag: str = "") -> Path:
    """`path` as a Path when it is a regular file; else a TraceError saying what it is (led by `flag`, the option
    that gave it), the one wording every reader of a trace path uses."""
    path = Path(path)
    if path.is_file():
        return path
    why = "is a folder, not a trace file" if path.is_dir() else "not a regular file" if path.exists() else \
        "no such trace file"
    raise TraceError(f"{flag} {path}: {why}" if flag else f"{path}: {why}")


def load(path: str | os.PathLike) -> RoutingTrace:
    from safetensors import SafetensorError, safe_open

    path = trace_file(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            names = set(f.keys())
            arrays = {n: f.get_tensor(n) for n in names}
    except (SafetensorError, OSError, ValueError, json.JSONDecodeError) as e:
        raise TraceError(f"{path}: not a readable safetensors trace ({e})") from None
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise TraceError(f"{path}: metadata is missing {', '.join(repr(m) for m in missing)}")
    if meta["format_version"] != FORMAT_VERSION:
        raise TraceError(f"{path}: metadata 'format_version' is {meta['format_version']!r}; "
                         f"this build reads version {FORMAT_VERSION}")
    for req in ("experts", "request", "turn", "phase", "token"):
        if req not in arrays:
            raise TraceError(f"{path}: field '{req}' is missing")
    ints = {}
    for key in ("num_layers", "num_experts", "top_k"):
        try:
            ints[key] = int(meta[key])
        except ValueError:
            raise TraceError(f"{path}: metadata '{key}' must be an integer, got {meta[key]!r}") from None
    extra = {k: v for k, v in meta.items() if k not in REQUIRED_META}
    try:
        trace = RoutingTrace(
            experts=arrays["experts"], num_experts=ints["num_experts"], model=meta["model"], source=meta["source"],
            request=arrays["request"], turn=arrays["turn"], phase=arrays["phase"], token=arrays["token"],
            gates=arrays.get("gates"), hint=arrays.get("hint"),
            draft=arrays.get("draft"), extra=extra,
        )
    except TraceError as e:
        raise TraceError(str(e).replace("trace:", f"{path}:", 1)) from None
    for key in ("num_layers", "top_k"):
        if ints[key] != getattr(trace, key):
            raise TraceError(f"{path}: metadata '{key}' is {ints[key]} but field 'experts' has "
                             f"{getattr(trace, key)}")
    return trace
