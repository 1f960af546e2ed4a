"""Trace files: round trip, and every malformed input fails with a TraceError naming the file and the field."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from freetoken.trace import FORMAT_VERSION, RoutingTrace, TraceError, load, save
from freetoken.trace.importers import import_trace

T, L, E, K = 12, 3, 8, 2


def _trace(gates=True) -> RoutingTrace:
    rng = np.random.default_rng(0)
    ex = np.argsort(rng.random((T, L, E)), axis=2)[:, :, :K].astype(np.int16)
    g = rng.random((T, L, K)).astype(np.float16) if gates else None
    return RoutingTrace(ex, E, model="tiny", source="test", request=np.repeat(np.arange(3, dtype=np.int32), 4),
                        phase=np.tile(np.array([0, 0, 1, 1], np.int8), 3), token=np.arange(T, dtype=np.int32),
                        gates=g, extra={"note": "kept"})


def _tensors(trace: RoutingTrace) -> dict:
    return {n: getattr(trace, n) for n in ("experts", "request", "turn", "phase", "token")}


def test_round_trip_keeps_every_field(tmp_path):
    t = _trace()
    back = load(save(t, tmp_path / "t.safetensors"))
    for name in ("experts", "request", "turn", "phase", "token", "gates"):
        a, b = getattr(t, name), getattr(back, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert (back.model, back.source, back.num_experts, back.extra["note"]) == ("tiny", "test", E, "kept")


def test_round_trip_without_gates(tmp_path):
    assert load(save(_trace(gates=False), tmp_path / "t.safetensors")).gates is None


def _write(path, tensors, meta):
    save_file(tensors, str(path), metadata=meta)
    return path


def _meta(**over):
    meta = {"model": "m", "num_layers": str(L), "num_experts": str(E), "top_k": str(K), "source": "s",
            "format_version": FORMAT_VERSION}
    meta.update(over)
    return {k: v for k, v in meta.items() if v is not None}


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(experts=d["experts"].astype(np.int32)), "field 'experts' must be int16, got int32"),
    (lambda d: d["experts"].__setitem__((5, 1, 0), E), f"holds id {E} at token 5, layer 1"),
    (lambda d: d.update(request=d["request"][:-1]), f"field 'request' must have shape ({T},)"),
    (lambda d: d.update(phase=d["phase"].astype(np.int32)), "field 'phase' must be int8"),
    (lambda d: d["experts"].__setitem__((7, 2), [3, 3]), "repeats an expert within one top-k at token 7, layer 2"),
    (lambda d: d.pop("turn"), "field 'turn' is missing"),
])
def test_malformed_arrays_are_named(tmp_path, mutate, message):
    d = {k: v.copy() for k, v in _tensors(_trace(gates=False)).items()}
    mutate(d)
    path = _write(tmp_path / "bad.safetensors", d, _meta())
    with pytest.raises(TraceError) as e:
        load(path)
    assert message in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("over, message", [
    ({"model": None}, "metadata is missing 'model'"),
    ({"num_experts": "eight"}, "metadata 'num_experts' must be an integer"),
    ({"top_k": "3"}, "metadata 'top_k' is 3 but field 'experts' has 2"),
    ({"format_version": "99"}, "format_version"),
])
def test_malformed_metadata_is_named(tmp_path, over, message):
    path = _write(tmp_path / "bad.safetensors", _tensors(_trace(gates=False)), _meta(**over))
    with pytest.raises(TraceError, match=message):
        load(path)


def test_truncated_file_is_named(tmp_path):
    path = save(_trace(), tmp_path / "t.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError) as e:
        load(path)
    assert str(path) in str(e.value) and "not a readable safetensors trace" in str(e.value)


def test_bad_jsonl_line_names_file_line_and_field(tmp_path):
    good = {"dataset": "d", "problem_id": 0, "layer": 0, "experts": [1, 2], "gating_probs": [0.6, 0.4],
            "token_idx": 0}
    rows = [json.dumps(good), json.dumps(dict(good, token_idx=1)), json.dumps(dict(good, experts=[1, "2"]))]
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(TraceError) as e:
        import_trace(path)
    assert f"{path}, line 3: field 'experts' must be a list of 2 integers" in str(e.value)
    path.write_text(rows[0] + "\n{not json\n")
    with pytest.raises(TraceError, match="line 2: not valid JSON"):
        import_trace(path)


def test_duplicate_expert_in_a_jsonl_top_k_names_the_line(tmp_path):
    row = {"dataset": "d", "problem_id": 0, "layer": 0, "experts": [4, 4], "gating_probs": [0.5, 0.5],
           "token_idx": 0}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(TraceError, match=r"line 1: field 'experts' repeats an expert: \[4, 4\]"):
        import_trace(path, "mixtral_jsonl")


def test_failed_save_leaves_no_partial_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    import safetensors.numpy

    target = save(_trace(), tmp_path / "t.safetensors")
    before = target.read_bytes()

    def half_then_fail(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\x00" * 100)
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        save(_trace(gates=False), target)
    with pytest.raises(OSError):
        save(_trace(), tmp_path / "new.safetensors")
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.safetensors"]


@pytest.mark.parametrize("block", [3, 64, 1 << 16])
def test_first_repeat_finds_the_first_row_with_a_repeat_across_blocks(block):
    """validate's duplicate check against a row-by-row reference, blocks smaller and larger than the rows."""
    from freetoken.trace.format import _first_repeat

    rng = np.random.default_rng(5)
    rows = np.stack([rng.permutation(40)[:6] for _ in range(200)]).astype(np.int16)  # [200, 6] no repeats
    assert _first_repeat(rows, block) is None
    for where in ([150, 170], [5, 150], [199]):
        bad = rows.copy()
        for r in where:
            bad[r, 4] = bad[r, 1]
        reference = next(i for i, row in enumerate(bad.tolist()) if len(set(row)) < len(row))
        assert _first_repeat(bad, block) == reference == min(where)
