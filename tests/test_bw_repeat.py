"""Calibration that does not lie (freetoken/calibrate/repeat.py): each lane read several times, the median kept, a
reading far below the rest taken again; what the profile records, and that `--split auto` and the cost model take
the median. Readings are scripted: no timing here."""

from __future__ import annotations

import json

import pytest

from freetoken.calibrate.measure import Rate
from freetoken.calibrate.profile import load_profile, save_profile
from freetoken.calibrate.repeat import Repeated, measure_repeated, repeat_rate


def rate(gb_s: float, peak: float | None = None) -> Rate:
    return Rate(gb_s, peak or gb_s * 1.2, 1.0, 4, 1000)


def scripted(*values):
    it = iter(values)
    return lambda: rate(next(it))


def test_the_median_of_agreeing_readings_is_kept():
    r = repeat_rate(scripted(7.0, 6.5, 7.4), 3)
    assert r.rates == [7.0, 6.5, 7.4] and r.median_gb_s == 7.0 and not r.discarded
    assert r.spread == pytest.approx((7.4 - 6.5) / 7.0)
    d = r.to_dict()
    assert (d["gb_s"], d["median_gb_s"], d["min_gb_s"], d["max_gb_s"]) == (7.0, 7.0, 6.5, 7.4)
    assert d["repeats"] == 3 and d["retried"] == 0 and len(d["readings"]) == 3
    assert d["peak_gb_s"] == pytest.approx(7.4 * 1.2) and d["passes"] == 12 and d["seconds"] == 3.0


def test_a_collapsed_reading_is_measured_again():
    """The issue's case: 0.05 GB/s once (the other core busy), 7 GB/s a minute later."""
    log = []
    r = repeat_rate(scripted(7.0, 0.05, 7.2, 6.9), 3, log=log.append)
    assert r.rates == [7.0, 7.2, 6.9] and [x.gb_s for x in r.discarded] == [0.05]
    assert r.median_gb_s == 7.0 and r.to_dict()["discarded_gb_s"] == [0.05] and r.to_dict()["retried"] == 1
    assert log == ["reading 2 at 1% of the others' median: measured again"]


def test_retries_are_bounded_and_a_slow_machine_keeps_its_honest_median():
    # every reading collapsed: nothing is far below the rest, nothing is retried
    assert not repeat_rate(scripted(0.05, 0.06, 0.05), 3).discarded
    # one reading keeps collapsing: retried max_retries times, then kept
    r = repeat_rate(scripted(7.0, 0.1, 7.0, 0.1, 0.1), 3, max_retries=2)
    assert len(r.discarded) == 2 and sorted(r.rates) == [0.1, 7.0, 7.0] and r.median_gb_s == 7.0
    # just above half the others' median: kept as it is
    assert not repeat_rate(scripted(7.0, 3.6, 7.0), 3).discarded
    # one reading: nothing to compare it with
    assert repeat_rate(scripted(0.01), 1).rates == [0.01]


def test_two_lanes_run_at_once_are_retried_as_a_pair():
    pairs = iter([(10.0, 20.0), (10.5, 1.0), (9.5, 19.0), (10.2, 21.0)])

    def both():
        cpu, dma = next(pairs)
        return {"cpu_lane": rate(cpu), "gather": rate(dma)}

    out = measure_repeated(both, 3)
    assert out["gather"].rates == [20.0, 19.0, 21.0] and out["cpu_lane"].rates == [10.0, 9.5, 10.2]
    assert [x.gb_s for x in out["cpu_lane"].discarded] == [10.5]  # its partner collapsed: the pair goes


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="repeats must be positive"):
        measure_repeated(lambda: {}, 0)
    with pytest.raises(ValueError, match="low must lie"):
        measure_repeated(lambda: {"x": rate(1)}, 2, low=1.5)


def lane(*values: float) -> dict:
    return Repeated(tuple(rate(v) for v in values)).to_dict()


def profile(**over) -> dict:
    p = {"version": 2, "key": "cpu|bf16", "gpu": None, "expert_format": "bf16", "geometry": {}, "threads": 2,
         "repeats": 3, "host": lane(8.0, 8.2, 8.1), "cpu_lane": lane(1.0, 0.9, 1.1), "pcie": None, "overlap": None,
         "recommendation": {"mode": "cpu"}}
    return {**p, **over}


def test_the_profile_holds_readings_median_spread_and_threads(tmp_path):
    path = save_profile(profile(), tmp_path / "bw.json")
    p = load_profile(path)
    assert p["cpu_lane"]["gb_s"] == 1.0 and p["cpu_lane"]["readings"][2]["gb_s"] == 1.1 and p["threads"] == 2


@pytest.mark.parametrize("change, message", [
    ({"version": 1}, "profile version 1 is not 2; rerun"),
    ({"threads": 0}, "threads must be positive"),
    ({"cpu_lane": {**lane(1.0, 2.0, 3.0), "readings": []}}, r"cpu_lane\.readings must list"),
    ({"host": {**lane(1.0, 2.0, 3.0), "gb_s": 5.0}}, r"host\.gb_s 5\.0 is not the median"),
    ({"overlap": {"cpu_lane": {"gb_s": 3.0}, "gather": lane(9.0)}}, r"overlap\.cpu_lane\.median_gb_s"),
])
def test_profiles_without_the_new_fields_are_refused(tmp_path, change, message):
    path = tmp_path / "bw.json"
    path.write_text(json.dumps(profile(**change)))
    with pytest.raises(ValueError, match=message):
        load_profile(path)


def test_the_bench_records_the_median_and_the_split_reads_it(monkeypatch, tmp_path):
    """run_bench with scripted lanes: one collapsed CPU-lane reading is retried, the profile's rate is the median,
    and what the cost model and the hybrid split read from the profile is that median."""
    from freetoken.calibrate import bench
    from freetoken.calibrate.lanes import Geometry
    from freetoken.sim.hardware import load_hardware, with_bench_profile

    cpu = iter([3.0, 0.04, 3.3, 2.9])
    monkeypatch.setattr(bench, "host_read", lambda span, seconds: rate(8.0))
    monkeypatch.setattr(bench, "cpu_lane", lambda pool, seconds, lane, per_call: rate(next(cpu)))
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    cfg = bench.BenchConfig(Geometry(64, 32, "fp32"), seconds=0.01, min_buffer_bytes=1 << 16, llc_multiple=0,
                            probe=False)
    p = bench.run_bench(cfg)
    assert p["cpu_lane"]["gb_s"] == 3.0 and p["cpu_lane"]["discarded_gb_s"] == [0.04]
    assert p["cpu_lane"]["experts_per_call"] == 4 and p["repeats"] == 3 and p["threads"] >= 1
    path = save_profile(p, tmp_path / "bw.json")
    hw = with_bench_profile(load_hardware("rtx5090-ryzen"), load_profile(path), str(path))
    assert hw.host_gb_s == 3.0 and "median" in hw.sources["host_gb_s"]


def test_the_hybrid_split_takes_the_overlapped_medians():
    from freetoken.calibrate.mode import recommend

    over = measure_repeated(iter([{"cpu_lane": rate(c), "gather": rate(g)}
                                  for c, g in ((10.0, 40.0), (0.05, 41.0), (12.0, 39.0), (11.0, 40.5))]).__next__, 3)
    cpu, dma = over["cpu_lane"].median_gb_s, over["gather"].median_gb_s
    assert (cpu, dma) == (11.0, 40.0)
    rec = recommend(45.0, cpu, dma, 4, {"offload_tok_s": 10.0, "hybrid_tok_s": 20.0})
    assert (rec["bh_gb_s"], rec["bp_gb_s"]) == (11.0, 40.0)


def test_the_cuda_branch_repeats_every_lane_and_recommends_from_the_medians(monkeypatch, tmp_path):
    """The GPU half of run_bench with its lanes scripted (no GPU here): PCIe bulk, gather and the overlapped pair
    are each read `repeats` times, a collapsed overlapped pair is retried as a pair, and the recommendation (and the
    hybrid split a profile hands `--split auto`) uses the medians."""
    from freetoken.calibrate import bench
    from freetoken.calibrate.lanes import Geometry
    from freetoken.calibrate.mode import resolve_split

    gather = iter([50.0, 52.0, 49.0])
    pairs = iter([(30.0, 45.0), (0.1, 46.0), (31.0, 44.0), (29.0, 45.5)])
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench.torch.cuda, "get_device_name", lambda: "GPU X")
    real_pool = bench.ExpertPool
    monkeypatch.setattr(bench, "ExpertPool", lambda geo, n, pin=False: real_pool(geo, n))
    monkeypatch.setattr(bench, "DeviceSlots", lambda pool, slots: None)
    monkeypatch.setattr(bench, "host_read", lambda span, seconds: rate(80.0))
    monkeypatch.setattr(bench, "cpu_lane", lambda pool, seconds, lane, per_call: rate(33.0))
    monkeypatch.setattr(bench, "h2d_bulk", lambda pool, seconds: rate(55.0))
    monkeypatch.setattr(bench, "gather_lane", lambda pool, slots, seconds, m: rate(next(gather)))

    def overlapped(cpu_pool, lane, gpu_pool, slots, seconds, m):
        cpu, dma = next(pairs)
        return rate(cpu), rate(dma)

    monkeypatch.setattr(bench, "overlapped", overlapped)
    import freetoken.calibrate.gpu_probe as gp
    import freetoken.calibrate.probe as probe

    monkeypatch.setattr(gp, "gpu_probe", lambda: {"launch_us": 3.0})
    seen = {}

    def decode_probe(bp, bh, model):
        seen["rates"] = (bp, bh)
        return {"offload_tok_s": 10.0, "hybrid_tok_s": 20.0, "model": "scripted"}

    monkeypatch.setattr(probe, "decode_probe", decode_probe)
    cfg = bench.BenchConfig(Geometry(64, 32, "fp32"), seconds=0.01, min_buffer_bytes=1 << 16, llc_multiple=0)
    p = bench.run_bench(cfg)
    assert p["pcie"]["gb_s"] == 50.0 and p["pcie"]["gather"]["readings"][1]["gb_s"] == 52.0
    assert p["overlap"]["cpu_lane"]["gb_s"] == 30.0 and p["overlap"]["gather"]["gb_s"] == 45.0  # 45, 44, 45.5 kept
    assert p["overlap"]["gather"]["discarded_gb_s"] == [46.0]  # retried with its collapsed partner
    assert seen["rates"] == (45.0, 30.0)  # the decode probe's hybrid split at the medians
    rec = p["recommendation"]
    assert (rec["bp_gb_s"], rec["bh_gb_s"]) == (45.0, 30.0) and rec["mode"] == "hybrid"
    save_profile(p, tmp_path / "bw-gpu-x-fp32.json")
    split = resolve_split("auto", "GPU X", "fp32", tmp_path).split
    assert (split.mode, split.bp, split.bh) == ("hybrid", 45.0, 30.0)
