"""Importers on the real routing logs: counts equal the ones in shared/traces/README.md, and rows equal the raw
file parsed independently here."""

import json
from collections import defaultdict

import numpy as np
import pytest

from freetoken.trace import TraceError
from freetoken.trace.importers import IMPORTERS, detect_format, import_trace

MIXTRAL = [  # file, rows, problems, tokens, tokens with all 32 layers (shared/traces/README.md)
    ("gsm8k_2_routing.jsonl", 7889, 2, 247, 244),
    ("humaneval_1_routing.jsonl", 2579, 1, 83, 77),
    ("humaneval_2_routing.jsonl", 10779, 2, 338, 333),
    ("routing_raw.jsonl", 6777, 1, 135, 58),
]


def _raw_mixtral(path):
    """Reference parse: (problem, position) -> layer -> list of (experts, gates) rows."""
    tokens = defaultdict(lambda: defaultdict(list))
    problems = []
    n = 0
    for line in open(path):
        r = json.loads(line)
        n += 1
        pid = (r["dataset"], r["problem_id"])
        if pid not in problems:
            problems.append(pid)
        pos = r["token_idx"] if "token_idx" in r else r["token_pos"]
        tokens[(problems.index(pid), pos)][r["layer"]].append((r["experts"], r["gating_probs"]))
    return n, problems, tokens


@pytest.mark.parametrize("name, rows, problems, tokens, complete", MIXTRAL)
def test_mixtral_counts_and_rows_match_the_raw_file(shared_traces, name, rows, problems, tokens, complete):
    path = shared_traces / "mixtral-8x7b" / name
    n, probs, raw = _raw_mixtral(path)
    assert (n, len(probs), len(raw)) == (rows, problems, tokens)
    trace = import_trace(path)
    assert detect_format(path) == "mixtral_jsonl"
    assert trace.experts.shape == (complete, 32, 2) and trace.num_experts == 8
    assert int(trace.extra["dropped_tokens"]) == tokens - complete
    assert len(np.unique(trace.request)) == problems
    # the reference: tokens with exactly one row per layer, sorted by (problem, position)
    keep = sorted(k for k, layers in raw.items() if all(len(layers[l]) == 1 for l in range(32)))
    assert len(keep) == complete
    want = np.array([[layers_of[l][0][0] for l in range(32)] for layers_of in (raw[k] for k in keep)])
    gates = np.array([[layers_of[l][0][1] for l in range(32)] for layers_of in (raw[k] for k in keep)])
    assert np.array_equal(trace.experts, want)
    assert np.array_equal(trace.gates, gates.astype(np.float16))
    assert np.array_equal(trace.request, [k[0] for k in keep])


def test_mixtral_incomplete_error_names_problem_and_token(shared_traces):
    with pytest.raises(TraceError, match=r"problem gsm8k/0 token 166 lacks layers \[9\]"):
        import_trace(shared_traces / "mixtral-8x7b" / "gsm8k_2_routing.jsonl", incomplete="error")


def test_mixtral_duplicate_rows_are_counted(shared_traces):
    trace = import_trace(shared_traces / "mixtral-8x7b" / "routing_raw.jsonl")
    # rows beyond the first for a (token, layer): 6777 rows - 135 tokens' distinct layers logged
    n, _, raw = _raw_mixtral(shared_traces / "mixtral-8x7b" / "routing_raw.jsonl")
    distinct = sum(len(layers) for layers in raw.values())
    assert int(trace.extra["duplicate_rows"]) == n - distinct > 0


def test_granite_prompts_become_requests_with_prefill_then_decode(shared_traces):
    path = shared_traces / "granite-3.0-1b-a400m" / "moe_expert_trace.json"
    raw = json.load(open(path))
    trace = import_trace(path)
    assert detect_format(path) == "granite_json"
    lens = [p["prompt_len"] for p in raw["prompts"].values()]  # 39, 44, 29; 64 decode steps each
    assert trace.experts.shape == (sum(lens) + 3 * 64, 24, 8) and trace.num_experts == 32
    assert np.bincount(trace.phase).tolist() == [sum(lens), 3 * 64]
    for r, (name, p) in enumerate(raw["prompts"].items()):
        tok = trace.select(trace.request == r)
        assert tok.phase.tolist() == [0] * p["prompt_len"] + [1] * 64
        assert np.array_equal(tok.experts[: p["prompt_len"]], p["prefill"])
        assert np.array_equal(tok.experts[p["prompt_len"]:], p["decode"])
    assert json.loads(trace.extra["request_names"]) == list(raw["prompts"])


def test_qwen_drops_profiling_passes_and_keeps_two_requests(shared_traces):
    path = shared_traces / "qwen1.5-moe-a2.7b" / "moe_routes.jsonl"
    lines = [json.loads(s) for s in open(path)]
    routes = [r for r in lines if r["type"] == "route"]
    assert len(routes) == 18818
    # two vLLM profiling passes of 8192 rows each repeat one route: 18818 - 2 * 8192 = 2434 real tokens
    trace = import_trace(path)
    assert detect_format(path) == "qwen_routes"
    assert trace.experts.shape == (2434, 1, 4) and trace.num_experts == 60
    assert int(trace.extra["dropped_tokens"]) == 2 * 8192
    assert len(np.unique(trace.request)) == 2
    # independently: passes end where token_idx stops increasing; the profiling ones hold one route 8192 times
    cuts = [0] + [i for i in range(1, len(routes)) if routes[i]["token_idx"] <= routes[i - 1]["token_idx"]]
    passes = [routes[a:b] for a, b in zip(cuts, cuts[1:] + [len(routes)])]
    profiling = [p for p in passes if len(p) == 8192 and len({tuple(r["topk_ids"]) for r in p}) == 1]
    assert len(profiling) == 2
    rest = [r for p in passes if not any(p is q for q in profiling) for r in p]
    assert trace.experts[:, 0].tolist() == [r["topk_ids"] for r in rest]
    assert trace.gates[:, 0].tolist() == np.asarray([r["topk_weights"] for r in rest], np.float16).tolist()
    prefill = sum(len(passes[i + 1]) for i, p in enumerate(passes) if any(p is q for q in profiling))
    assert prefill == 65 + 91 and np.bincount(trace.phase).tolist() == [prefill, 2434 - prefill]
    kept = import_trace(path, profile_passes="keep")
    assert kept.num_tokens == 18818 and kept.extra["dropped_tokens"] == "0"


def test_deepseek_requests_follow_offsets(shared_traces):
    path = shared_traces / "deepseek-v2-lite" / "deepseek_v2_lite_prefill_top6.npz"
    with np.load(path) as z:
        experts, offsets = z["experts"], z["offsets"]
    trace = import_trace(path)
    assert detect_format(path) == "deepseek_npz"
    assert trace.experts.shape == (192023, 26, 6) and trace.num_experts == 64
    assert len(np.unique(trace.request)) == 1999 and (trace.phase == 0).all()
    assert np.array_equal(np.bincount(trace.request), np.diff(offsets))
    for i in (0, 316, 1998):  # spot-check prompt boundaries
        assert np.array_equal(trace.experts[offsets[i]:offsets[i + 1]], experts[offsets[i]:offsets[i + 1]])
        assert (trace.request[offsets[i]:offsets[i + 1]] == i).all()
    assert trace.extra["missing_prompt_ids"] == "317"


def test_aggregate_counts_file_is_not_mistaken_for_a_trace(shared_traces):
    with pytest.raises(TraceError, match="cannot tell the routing-log format"):
        import_trace(shared_traces / "granite-3.0-1b-a400m" / "moe_router_skew_counts.json")


# synthetic inputs: every row-level failure names the line and the field
ROW = {"dataset": "d", "problem_id": 0, "layer": 0, "experts": [1, 2], "gating_probs": [0.6, 0.4], "token_idx": 0}


@pytest.mark.parametrize("bad, message", [
    ({"layer": None}, "line 2: field 'layer' must be a non-negative integer, got null"),
    ({"gating_probs": [0.5]}, "line 2: field 'gating_probs' must be a list of 2 numbers"),
    ({"experts": [1, 9]}, r"line 2: field 'experts' holds \[1, 9\]; ids must lie in \[0, 8\)"),
    ({"problem_id": [0]}, "line 2: field 'problem_id' must be an integer or a string"),
])
def test_mixtral_row_errors(tmp_path, bad, message):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(dict(ROW, token_idx=1, **bad)) + "\n")
    with pytest.raises(TraceError, match=message):
        import_trace(path)


def test_missing_position_field_is_named(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({k: v for k, v in ROW.items() if k != "token_idx"}) + "\n")
    with pytest.raises(TraceError, match="line 1: field 'token_idx' is missing"):
        import_trace(path)


def test_unknown_format_and_option_list_the_valid_ones(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    with pytest.raises(ValueError, match="valid: " + ", ".join(IMPORTERS)):
        import_trace(path, "csv")
    with pytest.raises(ValueError, match="format 'mixtral_jsonl' takes no option profile_passes"):
        import_trace(path, profile_passes="keep")


def test_deepseek_bad_offsets_are_named(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, experts=np.zeros((4, 2, 2), np.int8) + np.array([0, 1], np.int8),
             offsets=np.array([0, 3, 5]), prompt_ids=np.array([1, 2], np.int32))
    with pytest.raises(TraceError, match="field 'offsets' must rise from 0 to 4"):
        import_trace(path)
