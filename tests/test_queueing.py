"""FIFO queue simulation under recorded arrivals."""

from __future__ import annotations

import pytest

from runinfra_opt.optimize.queueing import service_times, simulate_fifo, simulate_variants
from runinfra_opt.records import RequestRecord


def test_no_overlap_means_no_wait() -> None:
    q = simulate_fifo("baseline", [0.0, 10.0, 20.0], [(0.1, 1.0)] * 3)
    assert q.mean_wait_s == 0.0
    assert q.ttft_s["p50"] == pytest.approx(0.1)
    assert q.utilisation == pytest.approx(3.0 / 21.0)


def test_burst_queues_in_arrival_order() -> None:
    # three requests at once, 2 s each: waits 0, 2, 4; TTFT 0.5, 2.5, 4.5
    q = simulate_fifo("v", [0.0, 0.0, 0.0], [(0.5, 2.0)] * 3)
    assert q.mean_wait_s == pytest.approx(2.0)
    assert q.ttft_s["p50"] == pytest.approx(2.5)
    assert q.ttft_s["p99"] == pytest.approx(4.5, rel=0.01)
    assert q.utilisation == pytest.approx(1.0)


def test_unsorted_arrivals_are_served_by_arrival_time() -> None:
    q = simulate_fifo("v", [5.0, 0.0], [(1.0, 1.0), (1.0, 6.0)])
    # request at 0 runs until 6; the one at 5 waits 1 s
    assert q.mean_wait_s == pytest.approx(0.5)


def test_faster_service_cuts_queueing_delay() -> None:
    arrivals = [0.0, 0.5, 1.0, 1.5]
    slow = simulate_fifo("baseline", arrivals, [(0.1, 1.0)] * 4)
    fast = simulate_fifo("ngram", arrivals, [(0.1, 0.5)] * 4)
    assert fast.ttft_s["p95"] < slow.ttft_s["p95"]
    assert fast.mean_wait_s == 0.0


def test_mismatched_inputs_raise() -> None:
    with pytest.raises(ValueError, match="arrival"):
        simulate_fifo("v", [0.0], [])


def _rec(rid: str, repeat: int, ttft: float, e2e: float) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        category="c",
        repeat=repeat,
        prompt_tokens=1,
        output_tokens=1,
        ttft_s=ttft,
        e2e_s=e2e,
        target_passes=1,
    )


def test_service_times_take_the_median_of_repeats_and_skip_missing_arrivals() -> None:
    records = [_rec("a", 0, 0.1, 1.0), _rec("a", 1, 0.3, 3.0), _rec("a", 2, 0.2, 2.0), _rec("b", 0, 0.1, 1.0)]
    assert service_times(records) == {"a": (0.2, 2.0), "b": (0.1, 1.0)}
    sims = simulate_variants({"a": 0.0, "b": None}, {"baseline": records})
    assert len(sims) == 1
    assert sims[0].ttft_s["p50"] == pytest.approx(0.2)
    assert simulate_variants({"a": None, "b": None}, {"baseline": records}) == []
