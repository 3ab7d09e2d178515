"""`load.cycle`: a load level's requests cycled past the sample (`--capacity-requests`)."""

from __future__ import annotations

import pytest

from runinfra_opt.load.capacity import peak_rate
from runinfra_opt.load.cycle import cache_salt, cycle, original_id
from runinfra_opt.workload.model import Request


def _sample(arrivals: bool = True) -> list[Request]:
    return [
        Request(id=f"r{i}", line=i + 1, prompt=f"p{i}", arrival_s=(10.0 + 2.0 * i) if arrivals else None)
        for i in range(4)
    ]


def test_cycle_repeats_the_sample_in_order_as_numbered_copies() -> None:
    sample = _sample()
    out = cycle(sample, 10)
    assert [r.id for r in out] == ["r0", "r1", "r2", "r3", "r0+1", "r1+1", "r2+1", "r3+1", "r0+2", "r1+2"]
    assert [r.copy for r in out] == [0] * 4 + [1] * 4 + [2] * 2
    assert [r.prompt for r in out[4:8]] == [r.prompt for r in sample]
    assert [r.line for r in out[4:8]] == [1, 2, 3, 4]  # an error in a copy names the recorded line
    assert [original_id(r) for r in out] == [r.id for r in sample] * 2 + ["r0", "r1"]
    assert cycle(sample, None) == sample
    assert cycle(sample, 3) == sample  # never fewer than the planned requests
    assert cycle([], 5) == []


def test_cycled_arrivals_keep_the_recorded_rate() -> None:
    """4 arrivals 2 s apart (span 6 s): the pattern repeats every 8 s, so the gaps stay 2 s and the rate 0.5/s."""
    out = cycle(_sample(), 12)
    times = [r.arrival_s for r in out]
    assert times == pytest.approx([10.0 + 2.0 * i for i in range(12)])
    assert peak_rate([t for t in times if t is not None]) == pytest.approx(0.5)
    assert all(r.arrival_s is None for r in cycle(_sample(arrivals=False), 6))


def test_a_session_is_copied_whole_under_a_new_session_id() -> None:
    turns = [
        Request(id="a1", line=1, prompt="x", session_id="a", turn=1),
        Request(id="a2", line=2, prompt="y", session_id="a", turn=2),
    ]
    out = cycle(turns, 4)
    assert [(r.session_id, r.turn) for r in out] == [("a", 1), ("a", 2), ("a+1", 1), ("a+1", 2)]


def test_each_repetition_caches_apart() -> None:
    out = cycle(_sample(), 9)
    salts = [cache_salt("level-7", r) for r in out]
    assert salts[:4] == ["level-7"] * 4  # the sample's requests share the level's cache, as recorded traffic does
    assert len({salts[0], salts[4], salts[8]}) == 3  # a copy never reads its original's cached prompt
