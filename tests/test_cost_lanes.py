"""Cost model lanes against times derived by hand on a one-layer toy model.

Toy: one MoE layer of 4 experts (top-2); an expert is 3e6 params at 8 bits = S = 3 MB. Hardware: HBM 3 GB/s
(S / HBM = 1 ms), PCIe BP 1.5 GB/s (S / BP = 2 ms), host BH 3 GB/s (S / BH = 1 ms), GPU and CPU at 1 TFLOP/s
(one token through an expert: 2 x 3e6 FLOPs = 6 us, so decode is byte-bound). Dense weights of the layer are
3e6 params at 8 bits = 3 MB: 1 ms at HBM (+3 bytes of KV per context token, 1 ns).
"""

import math

import numpy as np
import pytest

from freetoken.placement import LRU, Split, balanced_fetch_count, make_call, paper_fetch_count
from freetoken.sim.cost import CallMeta, CostOptions, charge
from freetoken.sim.hardware import HardwareProfile
from freetoken.sim.lanes import roofline, share
from freetoken.sim.model_card import ModelCard
from freetoken.sim.replay import COLUMNS, ReplayLog, replay

MS = 1e-3
KV_NS = 3 / 3e9  # one context token of KV at HBM


def toy_card(**kw) -> ModelCard:
    base = dict(name="toy", hf_id="none", num_layers=1, moe_layers=1, num_experts=4, top_k=2, shared_experts=0,
                hidden_size=1000, expert_intermediate_size=1000, dense_params=0.003, embedding_params=0.0,
                kv_bytes_per_token=3, attention_layers=1, attention_width=1, expert_bits=8.0, dense_bits=8.0,
                total_params=0.015, active_params=0.009, source="test")
    return ModelCard(**{**base, **kw})


def toy_hw(**kw) -> HardwareProfile:
    base = dict(name="toy", gpu="g", cpu="c", vram_gib=1.0, hbm_gb_s=3.0, gpu_bf16_tflops=1.0, gpu_fp8_tflops=0.0,
                gpu_int4_tflops=0.0, gpu_int8_tflops=0.0, pcie_gb_s=1.5, host_gb_s=3.0, dram_gb_s=1000.0,
                cpu_tflops=1.0, cpu_lane_latency_us=0.0, pcie_call_latency_us=0.0, gpu_reserved_gib=0.0)
    base.update(kw)
    numeric = [k for k, v in base.items() if isinstance(v, float)]
    return HardwareProfile(**base, sources={k: "test" for k in numeric})


def log_of(*calls: dict) -> ReplayLog:
    """calls: dicts of the columns that are not zero."""
    return ReplayLog(**{c: np.asarray([call.get(c, 0) for call in calls], np.int64) for c in COLUMNS})


def meta_of(tokens, context=None) -> CallMeta:
    tokens = np.asarray(tokens, np.int64)
    context = np.zeros_like(tokens) if context is None else np.asarray(context, np.int64)
    return CallMeta(tokens, context, np.zeros_like(tokens))


def seconds(calls, tokens, options=CostOptions(host="independent"), hw=None, card=None):
    return charge(log_of(*calls), meta_of(tokens), card or toy_card(), hw or toy_hw(), options).seconds


DENSE = 1 * MS + KV_NS  # dense weights + one token of KV, decode at context 0


def test_roofline_takes_the_slower_of_bytes_and_flops():
    assert roofline(1e9, 2e12, 1e12, 1e15) == pytest.approx(2e-3)  # 1 ms of bytes, 2 ms of FLOPs
    assert roofline(3e9, 2e12, 1e12, 1e15) == pytest.approx(3e-3)


def test_gpu_lane_resident_experts_decode():
    # dense 1 ms, then 2 resident experts: 2 x S / HBM = 2 ms
    t = seconds([dict(phase=1, hits=2, hit_tokens=2)], [1])
    assert t[0] == pytest.approx(DENSE + 2 * MS)


def test_gpu_lane_compute_bound_prefill_chunk():
    # 1000 tokens on one resident expert: 2 x 3e6 x 1000 = 6e9 FLOPs / 1e12 = 6 ms > 1 ms of bytes.
    # dense: 2 x 3e6 x 1000 = 6e9 FLOPs (6 ms) + attention 4 x 1 x 1000 x (0 + 500.5) = 2.0e6 FLOPs (2 us)
    t = seconds([dict(phase=0, hits=1, hit_tokens=1000)], [1000])
    dense = (6e9 + 4 * 1000 * 500.5) / 1e12
    assert t[0] == pytest.approx(dense + 6 * MS)


def test_pcie_lane_offload_decode():
    # routed at 1 ms; 2 fetches: 2 x 2 ms on PCIe -> landed at 5 ms; computed after: 2 x 1 ms -> 7 ms
    t = seconds([dict(phase=1, fetched=2, fetch_tokens=2)], [1])
    assert t[0] == pytest.approx(DENSE + 4 * MS + 2 * MS)


def test_every_traffic_term_reaches_its_lane():
    """One decode call with every byte flow present, each a different number of milliseconds, so that dropping any
    term from its lane changes that lane's busy time: GPU = dense weights 1 + KV 2 + states 4 + hits 2 x 1 + fetched
    experts computed 3 x 1; PCIe = (3 fetched + 2 prefetched) x 2; CPU = 4 x 1."""
    card = toy_card(state_bytes_per_sequence=6_000_000)  # read and written: 12 MB = 4 ms
    call = dict(phase=1, hits=2, hit_tokens=2, fetched=3, fetch_tokens=3, prefetched=2, cpu=4, cpu_tokens=4)
    meta = CallMeta(np.array([1]), np.array([2_000_000 - 1]), np.array([0]))  # 2e6 tokens of KV (this one too)
    t = charge(log_of(call), meta, card, toy_hw(), CostOptions(host="independent"))
    assert t.gpu[0] == pytest.approx((1 + 2 + 4 + 2 + 3) * MS, rel=1e-9)
    assert t.pcie[0] == pytest.approx((3 + 2) * 2 * MS, rel=1e-9)
    assert t.cpu[0] == pytest.approx(4 * MS, rel=1e-9)


def test_cpu_lane_decode_bytes_and_latency():
    # 2 experts on the CPU: 2 x S / BH = 2 ms, plus a 50 us lane latency
    t = seconds([dict(phase=1, cpu=2, cpu_tokens=2)], [1], hw=toy_hw(cpu_lane_latency_us=50.0))
    assert t[0] == pytest.approx(DENSE + 2 * MS + 50e-6)


def test_pcie_lane_latency_once_per_fetching_call():
    # 2 fetches: the 30 us call latency (routing ids to the host) once, then 2 x 2 ms of copies, 2 x 1 ms compute;
    # a call that fetches nothing pays no PCIe latency (2 hits: 2 ms)
    hw = toy_hw(pcie_call_latency_us=30.0)
    t = seconds([dict(phase=1, fetched=2, fetch_tokens=2), dict(phase=1, hits=2, hit_tokens=2)], [1, 1], hw=hw)
    assert t[0] == pytest.approx(DENSE + 30e-6 + 4 * MS + 2 * MS)
    assert t[1] == pytest.approx(DENSE + 2 * MS)


def test_cpu_lane_flop_bound_in_prefill():
    # 1000 tokens on one CPU expert at 1 TFLOP/s: 6 ms (bytes: 1 ms). GPU lane idle besides dense.
    t = seconds([dict(phase=0, cpu=1, cpu_tokens=1000)], [1000])
    dense = (6e9 + 4 * 1000 * 500.5) / 1e12
    assert t[0] == pytest.approx(dense + 6 * MS)


def test_call_waits_for_the_slowest_lane():
    # hybrid: 1 fetched (2 ms copy + 1 ms compute = 3 ms) beside 1 on the CPU (1 ms): the GPU lane decides
    t = seconds([dict(phase=1, fetched=1, fetch_tokens=1, cpu=1, cpu_tokens=1)], [1])
    assert t[0] == pytest.approx(DENSE + 3 * MS)


def test_copy_overlaps_resident_compute_only_with_overlap():
    call = dict(phase=1, hits=1, hit_tokens=1, fetched=1, fetch_tokens=1)
    # overlap: copy 1..3 ms beside the hit's compute 1..2 ms; fetched compute 3..4 ms
    assert seconds([call], [1])[0] == pytest.approx(DENSE + 3 * MS)
    # one stream: hit 1..2, copy 2..4, fetched compute 4..5
    serial = CostOptions(host="independent", overlap=False, double_buffer=False)
    assert seconds([call], [1], serial)[0] == pytest.approx(DENSE + 4 * MS)


def test_decode_copies_on_the_compute_stream_wait_for_the_hits():
    # FreeToken 0.1.2's decode: the miss gather is a kernel on the compute stream, so one hit (1 ms) and one fetch
    # (2 ms of PCIe, 1 ms of compute) run in turn: 1 + 2 + 1 ms after the router instead of max(1, 2) + 1 = 3 ms.
    # Prefill keeps the copy stream beside compute.
    call = dict(hits=1, hit_tokens=1, fetched=1, fetch_tokens=1)
    serial = CostOptions(host="independent", double_buffer=False, decode_overlap=False)
    assert seconds([dict(phase=1, **call)], [1])[0] == pytest.approx(DENSE + 3 * MS)
    assert seconds([dict(phase=1, **call)], [1], serial)[0] == pytest.approx(DENSE + 4 * MS)
    prefill = [dict(phase=0, **call)]
    assert seconds(prefill, [1], serial)[0] == pytest.approx(seconds(prefill, [1])[0])


def test_decode_copies_at_the_gather_rate_prefill_at_bp():
    # FreeToken 0.1.2's decode gather (SM loads of pinned memory) at 0.75 GB/s, half of BP = 1.5 GB/s: one fetch
    # copies in 3 MB / 0.75 GB/s = 4 ms instead of 2 ms, then 1 ms of compute. A prefill call's copy is the copy
    # engine's: still 2 ms. A gather rate above BP is capped at BP.
    fetch = dict(fetched=1, fetch_tokens=1)
    gather = CostOptions(host="independent", double_buffer=False, decode_gather_gb_s=0.75)
    assert seconds([dict(phase=1, **fetch)], [1], gather)[0] == pytest.approx(DENSE + 4 * MS + 1 * MS)
    assert seconds([dict(phase=0, **fetch)], [1], gather)[0] == pytest.approx(DENSE + 2 * MS + 1 * MS)
    above = CostOptions(host="independent", double_buffer=False, decode_gather_gb_s=3.0)
    assert seconds([dict(phase=1, **fetch)], [1], above)[0] == pytest.approx(DENSE + 2 * MS + 1 * MS)
    with pytest.raises(ValueError, match="decode_gather_gb_s must be >= 0"):
        CostOptions(decode_gather_gb_s=-1.0)


def test_double_buffering_loads_the_next_prefill_call_early():
    # two prefill calls of 1 token, each fetching one expert. Dense per call: 1 ms of bytes (FLOPs negligible).
    calls = [dict(phase=0, fetched=1, fetch_tokens=1, layer=0), dict(phase=0, fetched=1, fetch_tokens=1, layer=0)]
    d = 1 * MS + KV_NS
    # without: each call = dense 1 + copy 2 + compute 1 = 4 ms -> 8 ms
    single = CostOptions(host="independent", double_buffer=False)
    assert seconds(calls, [1, 1], single).sum() == pytest.approx(2 * (d + 3 * MS))
    # with: call 2's copy starts when call 1 starts (its buffer is free): PCIe busy 0..2 then 2..4 ms;
    # call 2 starts at 4 ms, routed at 5, its experts landed at 4: compute 5..6 -> 6 ms in all
    both = seconds(calls, [1, 1], CostOptions(host="independent"))
    assert both.sum() == pytest.approx(d + 3 * MS + d + 1 * MS)


def test_share_two_flows_by_hand():
    # a: 100 B capped at 10 B/s, b: 60 B capped at 20 B/s
    assert share(100, 10, 60, 20, math.inf) == pytest.approx((10.0, 3.0))
    assert share(100, 10, 60, 20, 45) == pytest.approx((10.0, 3.0))  # a DRAM above both caps: each at its own
    # DRAM 15 B/s < 30: rates 5 and 10; b ends at 6 s, a has 70 B left at 10 B/s -> 13 s
    assert share(100, 10, 60, 20, 15) == pytest.approx((13.0, 6.0))
    # the other way round: a (60 B at 10 B/s) ends at 6 s, b has 100 - 5 * 6 = 70 B left at min(10, 15) -> 13 s
    assert share(60, 20, 100, 10, 15) == pytest.approx((6.0, 13.0))
    assert share(0, 10, 60, 20, 15) == pytest.approx((0.0, 4.0))  # alone: min(cap, DRAM)
    assert share(100, 20, 0, 10, 15) == pytest.approx((100 / 15, 0.0))


def _hybrid_log(rule: str, m: int, hw: HardwareProfile):
    """A real replay: an empty cache, one decode call with m distinct experts, the spine's hybrid split."""
    card = toy_card(num_experts=8, top_k=m, total_params=0.003 + 8 * 0.003, active_params=0.003 + m * 0.003)
    split = Split("hybrid", rule, hw.pcie_gb_s, hw.host_gb_s)
    call = make_call(0, np.arange(m)[None, :], phase=1)
    return replay([call], LRU(0, 1, 8), split).log, card


@pytest.mark.parametrize("m, bp, bh", [(4, 1.5, 3.0), (8, 52.7, 77.3), (8, 56.0, 63.6), (6, 11.8, 47.5)])
def test_hybrid_q_is_the_spines_rule(m, bp, bh):
    hw = toy_hw(pcie_gb_s=bp, host_gb_s=bh)
    for rule, q in (("balanced", balanced_fetch_count(m, bp, bh)), ("paper", paper_fetch_count(m, bp, bh))):
        log, _ = _hybrid_log(rule, m, hw)
        assert (int(log.fetched[0]), int(log.cpu[0])) == (q, m - q)


def test_shared_dram_full_contention_hybrid_buys_nothing_over_all_cpu():
    # m = 4 misses, BP 1.5, BH 3, DRAM 3 GB/s (= BH: the CPU alone saturates what the DRAM gives).
    # balanced q = 1 (max(1/1.5, 3/3) = 1 beats q = 2: 1.33). Shared: rates 1 and 2 GB/s while both run;
    # copy ends at 3 ms, the CPU's last 3 MB at 3 GB/s end at 4 ms; fetched compute 4..5 ms (after routing at 1).
    # All-CPU: 12 MB at 3 GB/s = 4 ms. Both calls: dense 1 + 4 = 5 ms.
    hw = toy_hw(dram_gb_s=3.0)
    log, card = _hybrid_log("balanced", 4, hw)
    assert (int(log.fetched[0]), int(log.cpu[0])) == (1, 3)
    shared = charge(log, meta_of([1]), card, hw, CostOptions(host="shared")).seconds[0]
    all_cpu = seconds([dict(phase=1, cpu=4, cpu_tokens=4)], [1], CostOptions(host="shared"), hw, card)[0]
    assert all_cpu == pytest.approx(DENSE + 4 * MS)
    assert shared == pytest.approx(DENSE + 4 * MS)
    assert shared >= all_cpu - 1e-12
    # independent lanes: copy 2 ms + compute 1 ms beside 3 ms of CPU -> 3 ms: hybrid wins
    independent = charge(log, meta_of([1]), card, hw, CostOptions(host="independent")).seconds[0]
    assert independent == pytest.approx(DENSE + 3 * MS)


def test_prefill_streams_past_the_decode_working_set_in_every_engine():
    # 2 layers x 2 experts, 2 slots. A decode token uses both experts of both layers: LRU keeps layer 1's pair.
    # Two 2-token prefill chunks then use every expert. Streaming (the engines' admit_prefill=False): layer 0 is
    # copied to staging, layer 1 hits, per chunk -> 2 hits, 2 fetches, slots -1, the cache unchanged. Admission:
    # layer 0's copies evict layer 1's pair and layer 1's copies evict them back -> 0 hits, 4 fetches per chunk.
    from freetoken.sim.engines import ENGINES

    card = toy_card(num_layers=2, moe_layers=2, num_experts=2, top_k=2, total_params=0.015, active_params=0.015)
    hw = toy_hw()
    assert all(not e.split_for(card, hw).admit_prefill for e in ENGINES.values())
    both = np.array([[0, 1]])
    chunk = np.array([[0, 1], [1, 0]])
    calls = [make_call(0, both, phase=1), make_call(1, both, phase=1)]
    calls += [make_call(layer, chunk, phase=0) for _ in range(2) for layer in (0, 1)]
    for admit, hits, fetched in ((False, [0, 2, 0, 2], [2, 0, 2, 0]), (True, [0, 0, 0, 0], [2, 2, 2, 2])):
        split = ENGINES["freetoken-offload"].split_for(card, hw)
        split = Split(split.mode, split.rule, split.bp, split.bh, admit_prefill=admit)
        log = replay(calls, LRU(2, 2, 2), split).log
        assert log.hits[2:].tolist() == hits and log.fetched[2:].tolist() == fetched


def test_host_work_bounds_and_kernel_floors_by_hand():
    # one decode call with one resident expert: dense 1 ms + KV, the hit 1 ms. Host: 150 launches before the router
    # at 8 + 2 = 10 us = 1.5 ms (slower than the dense part's 1 ms + 3 kernels x 1 us), then a 20 us sync for the
    # routing ids, then 50 launches = 0.5 ms (faster than the hit's 1 ms + 2 kernels x 1 us).
    from freetoken.sim.overhead import HostWork

    hw = toy_hw(launch_us=8.0, sync_us=20.0, kernel_floor_us=1.0)
    one = lambda v: np.asarray([v], np.int64)  # noqa: E731
    work = HostWork(one(150), one(50), one(3), one(2), one(1), one(2), one(1), one(150))
    options = CostOptions(host="independent", dispatch_us=2.0)  # 8 + 2 = 10 us per launch
    t = charge(log_of(dict(hits=1, hit_tokens=1)), meta_of([1]), toy_card(), hw, options, work).seconds[0]
    assert t == pytest.approx(1.5 * MS + 20e-6 + max(1 * MS + 2e-6, 0.5 * MS), rel=1e-9)
    # the same call launch-bound after the router: 200 launches = 2 ms > the hit's 1.002 ms
    work.post_launches[:] = 200
    t = charge(log_of(dict(hits=1, hit_tokens=1)), meta_of([1]), toy_card(), hw, options, work).seconds[0]
    assert t == pytest.approx(1.5 * MS + 20e-6 + 2 * MS, rel=1e-9)
    # 50 launches before the router (0.5 ms) now run under the dense part and its 3 kernel floors (1.003 ms)
    work.pre_launches[:], work.post_launches[:] = 50, 50
    t = charge(log_of(dict(hits=1, hit_tokens=1)), meta_of([1]), toy_card(), hw, options, work).seconds[0]
    assert t == pytest.approx(DENSE + 3e-6 + 20e-6 + 1 * MS + 2e-6, rel=1e-9)
    # no host work: the old lanes, at the datasheet rates (the toy's efficiencies are 1)
    assert charge(log_of(dict(hits=1, hit_tokens=1)), meta_of([1]), toy_card(), hw, options).seconds[0] == \
        pytest.approx(DENSE + 1 * MS, rel=1e-9)


def test_achieved_rates_divide_the_datasheet_by_the_efficiency():
    hw = toy_hw(gemv_efficiency=0.5, gemm_efficiency=0.25)
    t = seconds([dict(hits=1, hit_tokens=1)], [1], hw=hw)[0]
    assert t == pytest.approx(2 * (DENSE + 1 * MS), rel=1e-9)  # byte-bound decode: half the bandwidth
    # a FLOP-bound prefill chunk: 1000 tokens through one expert = 6 GFLOP at 1 TFLOP/s x 0.25 = 24 ms
    t = seconds([dict(phase=0, hits=1, hit_tokens=1000)], [1000], hw=hw)[0]
    dense_flops = 2 * 0.003e9 * 1000 + 4 * 1 * 1000 * (0 + 1001 / 2)
    assert t == pytest.approx(max(2 * (1 * MS + 1000 * KV_NS), dense_flops / 0.25e12) + 24 * MS, rel=1e-9)


def test_expert_gemms_run_at_the_moe_gemm_efficiency():
    # the experts' grouped GEMMs at datasheet x moe_gemm_efficiency, the dense part still at gemm_efficiency
    hw = toy_hw(gemv_efficiency=0.5, gemm_efficiency=0.25, moe_gemm_efficiency=0.1)
    t = seconds([dict(phase=0, hits=1, hit_tokens=1000)], [1000], hw=hw)[0]
    dense_flops = 2 * 0.003e9 * 1000 + 4 * 1 * 1000 * (0 + 1001 / 2)
    # 1000 tokens through one expert = 6 GFLOP at 1 TFLOP/s x 0.1 = 60 ms
    assert t == pytest.approx(max(2 * (1 * MS + 1000 * KV_NS), dense_flops / 0.25e12) + 60 * MS, rel=1e-9)
    # a profile that does not give it (0) charges the experts as a large GEMM; out of [0, 1] is refused
    assert toy_hw(gemm_efficiency=0.25).moe_tflops("bf16") == pytest.approx(0.25)
    with pytest.raises(ValueError, match="moe_gemm_efficiency"):
        toy_hw(moe_gemm_efficiency=1.5)


def test_attention_flops_run_at_the_attention_efficiency():
    # a 1000-token chunk at context 5000: GEMM FLOPs at gemm_efficiency, QK^T and PV at attention_efficiency, in turn
    hw = toy_hw(gemm_efficiency=0.25, attention_efficiency=0.5)
    gemm_flops = 2 * 0.003e9 * 1000
    attn_flops = 4 * 1000 * 1000 * (5000 + 1001 / 2)  # attention width 1000: 22.002 GFLOP, 44.004 ms at 0.5 TFLOP/s
    t = charge(log_of(dict(phase=0)), meta_of([1000], [5000]), toy_card(attention_width=1000), hw,
               CostOptions(host="independent")).seconds
    assert t[0] == pytest.approx(max(1 * MS + 6000 * KV_NS, gemm_flops / 0.25e12 + attn_flops / 0.5e12), rel=1e-9)
    assert t[0] == pytest.approx(24 * MS + 44.004 * MS, rel=1e-9)
    assert toy_hw(gemm_efficiency=0.25).attention_tflops("bf16") == pytest.approx(0.25)  # not given: as a GEMM


def test_attention_runs_at_the_16_bit_rate_when_the_weights_run_int8():
    # llama.cpp on a Pascal-like GPU: its quantized weight GEMMs at the int8 (dp4a) rate, 4 TFLOPS; attention's flash
    # kernels at the 16-bit field, the FP32 rate there, 1 TFLOPS (both at efficiency 1). Same chunk as above:
    # GEMMs 6e9 / 4e12 = 1.5 ms, attention 22.002 GFLOP / 1e12 = 22.002 ms (at the int8 rate it would be 5.5 ms)
    hw = toy_hw(gpu_int8_tflops=4.0, gemm_efficiency=1.0)
    t = charge(log_of(dict(phase=0)), meta_of([1000], [5000]), toy_card(attention_width=1000, compute_dtype="int8"),
               hw, CostOptions(host="independent")).seconds
    assert t[0] == pytest.approx(1.5 * MS + 22.002 * MS, rel=1e-9)


def test_linear_attention_states_are_read_and_written_once_per_call():
    # a hybrid card's states (3 MB a sequence over its one layer): a decode call reads and writes them, 6 MB at 3 GB/s
    t = seconds([dict(hits=1, hit_tokens=1)], [1], card=toy_card(state_bytes_per_sequence=3_000_000))[0]
    assert t == pytest.approx(DENSE + 2 * MS + 1 * MS, rel=1e-9)


def test_streamed_calls_copy_the_layers_stream_early_and_no_other_call_does():
    # freetoken's double buffer: two 1-token prefill calls (layers 0, 1) each using one expert. Layer 0 copies its
    # own: dense d, copy 2 ms, compute 1 ms -> ends at d + 3. Layer 1 had its layer's 3 non-resident experts (one
    # used) streamed from when layer 0's copy freed the copy lane (d + 2): 3 x 2 ms -> lands at d + 8; routed at
    # 2d + 3 < d + 8, so its fetched expert computes 1 ms after the stream: ends d + 9, the call 6 ms
    calls = [dict(phase=0, fetched=1, fetch_tokens=1, layer=0), dict(phase=0, fetched=1, fetch_tokens=1, layer=1)]
    d = DENSE
    log, meta, on = log_of(*calls), meta_of([1, 1]), CostOptions(host="independent", double_buffer=True)
    times = charge(log, meta, toy_card(), toy_hw(), on, streamed=np.array([-1, 3]))
    assert times.seconds.tolist() == pytest.approx([d + 3 * MS, 6 * MS])
    assert times.pcie.tolist() == pytest.approx([2 * MS, 6 * MS])  # every streamed expert crosses PCIe
    # a call the engine does not stream (-1: layer 0 of a chunk, hybrid) loads after its routing, its fetches
    unstreamed = charge(log, meta, toy_card(), toy_hw(), on, streamed=np.array([-1, -1])).seconds
    assert unstreamed.tolist() == pytest.approx([d + 3 * MS, d + 3 * MS])
    with pytest.raises(ValueError, match="double_buffer on"):
        charge(log, meta, toy_card(), toy_hw(), CostOptions(host="independent", double_buffer=False),
               streamed=np.array([-1, 3]))


def test_layer_copies_load_every_expert_of_a_prefill_calls_layer():
    # FreeToken 0.1.2's full-layer loading: a 1-token prefill call using one resident and one fetched expert copies
    # all 4 experts of its layer (8 ms at BP), not its one miss (2 ms); the compute is the same (hit 1 ms after
    # the routing, fetched 1 ms after its copy): the call ends 6 ms later. A decode call copies its misses only.
    call = dict(phase=0, hits=1, hit_tokens=1, fetched=1, fetch_tokens=1)
    options = {c: CostOptions(host="independent", double_buffer=False, prefill_copies=c) for c in ("missing", "layer")}
    missing, layer = (charge(log_of(call), meta_of([1]), toy_card(), toy_hw(), options[c]).seconds[0]
                      for c in ("missing", "layer"))
    assert missing == pytest.approx(DENSE + 2 * MS + 1 * MS, rel=1e-9)
    assert layer == pytest.approx(DENSE + 8 * MS + 1 * MS, rel=1e-9)
    decode = dict(call, phase=1)
    assert (charge(log_of(decode), meta_of([1]), toy_card(), toy_hw(), options["layer"]).seconds[0]
            == pytest.approx(DENSE + 2 * MS + 1 * MS, rel=1e-9))
    with pytest.raises(ValueError, match="prefill_copies 'all' is not one of missing, layer"):
        CostOptions(prefill_copies="all")


def _two_layer_card() -> ModelCard:
    """Four layers, two of them MoE (Lm = 2): one attention layer (half a share per MoE call), one Gated DeltaNet
    layer of one head; dense weights 6 MB and 6 bytes of KV per token (3 MB and 3 bytes per MoE call), states 6 MB
    per sequence (read and written: 6 MB per sequence per MoE call)."""
    return toy_card(num_layers=4, moe_layers=2, attention_layers=1, linear_layers=1, linear_heads=1,
                    dense_params=0.006, kv_bytes_per_token=6, state_bytes_per_sequence=6_000_000,
                    attention_width=1000, total_params=0.030, active_params=0.018)


def test_a_batched_call_of_a_multi_layer_model_by_hand():
    """The dense part of one MoE call is the model's per-MoE-layer share, and a batched call (sequences) reads each
    sequence's KV and state: the toy's one-layer, one-sequence calls cannot tell * from / by Lm or seqs."""
    card, dense_only = _two_layer_card(), dict(phase=1)
    # decode of 2 sequences (1 token each) at mean context 999,999: bytes 3 MB dense + 3 B x 2 x 1e6 KV + 6 MB x 2
    # states = 21 MB at 3 GB/s = 7 ms; FLOPs (12 us GEMM, 4 us attention, 0.1 us delta rule) far under it
    meta = CallMeta(np.array([2]), np.array([999_999]), np.array([0]), sequences=np.array([2]))
    t = charge(log_of(dense_only), meta, card, toy_hw(), CostOptions(host="independent")).seconds[0]
    assert t == pytest.approx(21e6 / 3e9, rel=1e-9)
    # a prefill chunk of 2 sequences x 500 tokens at context 5,000, FLOP-bound (bytes: 3 MB + 3 B x 2 x 5,500 +
    # 12 MB = 5.011 ms): GEMMs 2 x 3e6 x 1000 = 6 ms; attention 4 x 1000 x 1000 x (5000 + 501 / 2) x 1/2 =
    # 10.501 ms; the delta rule per token of 64-token chunks 6 x 128 x 128 + 64 x (6 + 4) x 128 + 2 x 64^2 / 3,
    # x 1000 tokens / 2 MoE layers
    meta = CallMeta(np.array([1000]), np.array([5000]), np.array([0]), sequences=np.array([2]))
    t = charge(log_of(dict(phase=0)), meta, card, toy_hw(), CostOptions(host="independent")).seconds[0]
    delta_rule = (6 * 128 * 128 + 64 * 10 * 128 + 2 * 64 * 64 / 3) * 1000 / 2
    assert t == pytest.approx(6 * MS + 10.501 * MS + delta_rule / 1e12, rel=1e-9)


def test_a_prefill_call_after_a_decode_call_loads_nothing_early():
    # the double buffer loads a prefill call's experts while the call before it runs only when that call is a
    # prefill call too: after a decode step (a hit, 1 ms) the prefill call copies after its own routing
    calls = [dict(phase=1, hits=1, hit_tokens=1), dict(phase=0, fetched=1, fetch_tokens=1)]
    t = seconds(calls, [1, 1])
    assert t.tolist() == pytest.approx([DENSE + 1 * MS, DENSE + 2 * MS + 1 * MS])


def test_fetched_experts_compute_flop_bound_in_prefill():
    # a 1000-token prefill chunk on one fetched expert: its copy 2 ms, then 2 x 3e6 x 1000 FLOPs = 6 ms (bytes: 1 ms)
    single = CostOptions(host="independent", double_buffer=False)
    t = seconds([dict(phase=0, fetched=1, fetch_tokens=1000)], [1000], single)
    dense = (6e9 + 4 * 1000 * 500.5) / 1e12
    assert t[0] == pytest.approx(dense + 2 * MS + 6 * MS)
