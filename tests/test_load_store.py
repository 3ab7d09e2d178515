"""Raw load records survive a round trip to disk, written whole or streamed as they complete; an interrupted level
leaves its records readable; a corrupt file is one clear error naming its line."""

from __future__ import annotations

import asyncio
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runinfra_opt.errors import UserInputError
from runinfra_opt.load import Concurrency, LevelRun, LoadRecord, Rate, Replay, level_metrics, plan, run_level
from runinfra_opt.load.store import RecordWriter, StoredRecords, _peak_in_flight, read_run, write_run
from runinfra_opt.workload.model import Request


def _record(index: int) -> LoadRecord:
    record = LoadRecord(
        index=index,
        request_id=f"r{index}",
        category="chat",
        planned_s=0.5 * index,
        sent_s=0.5 * index + 0.001,
        done_s=0.5 * index + 1.2,
        success=index != 2,
        status=None if index != 2 else 500,
        error=None if index != 2 else "boom",
        ttft_s=0.2,
        e2e_s=1.199,
        output_tokens=3,
        prompt_tokens=17,
    )
    record.chunk_s = array("d", [0.5 * index + 0.2, 0.5 * index + 0.7])
    record.chunk_tokens = array("q", [1, 2])
    return record


@pytest.mark.parametrize("level", [Replay(0.5), Concurrency(4), Rate(2.5, 0.7, 3)])
def test_a_run_round_trips(tmp_path: Path, level: Replay | Concurrency | Rate) -> None:
    run = LevelRun(level, [_record(i) for i in range(4)], 1234.5, 3.25, 3, notes=["late"])
    path = tmp_path / "load" / "x.jsonl"
    write_run(path, run)
    back = read_run(path)
    assert back.level == level
    assert back.records == run.records
    assert (back.started_at, back.duration_s, back.peak_in_flight, back.notes) == (1234.5, 3.25, 3, ["late"])


def test_a_corrupt_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    write_run(path, LevelRun(Concurrency(1), [_record(0), _record(1)], 0.0, 1.0, 1))
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*lines[:2], "{not json\n", *lines[2:]]))
    with pytest.raises(UserInputError, match=r"x\.jsonl: line 3: not a load record"):
        read_run(path)


def test_a_line_after_the_end_or_a_missing_record_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    write_run(path, LevelRun(Concurrency(1), [_record(0), _record(1)], 0.0, 1.0, 1))
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*lines, lines[1]]))
    with pytest.raises(UserInputError, match=r"x\.jsonl: line 5: a line after the end line"):
        read_run(path)
    path.write_text("".join([lines[0], lines[1], lines[3]]))
    with pytest.raises(UserInputError, match=r"x\.jsonl: 1 records, but its end line says 2"):
        read_run(path)


def test_a_file_from_before_the_end_line_is_read(tmp_path: Path) -> None:
    # The first format: the header carried the duration, peak in flight and notes (written when the level ended).
    path = tmp_path / "old.jsonl"
    write_run(path, LevelRun(Replay(), [_record(0)], 5.0, 2.5, 1))
    header = '{"level":{"model":"replay","time_scale":1.0},"started_at":5.0,"duration_s":2.5,"peak_in_flight":1,'
    header += '"late_s":0.01,"notes":["old"]}\n'
    path.write_text(header + path.read_text().splitlines(keepends=True)[1])
    back = read_run(path)
    assert (back.duration_s, back.peak_in_flight, back.notes) == (2.5, 1, ["old"])
    assert back.records == [_record(0)]


def test_a_lazy_run_reads_its_records_again_on_each_pass(tmp_path: Path) -> None:
    run = LevelRun(Rate(2.0), [_record(i) for i in range(5)], 0.0, 4.0, 2, notes=["n"])
    path = tmp_path / "x.jsonl"
    write_run(path, run)
    lazy = read_run(path, lazy=True)
    assert isinstance(lazy.records, StoredRecords)
    assert len(lazy.records) == lazy.requests == 5
    assert list(lazy.records) == run.records
    assert list(lazy.records) == run.records  # a second pass
    assert _record(3) in lazy.records
    assert lazy.send_lags() == pytest.approx(run.send_lags())
    assert lazy.records_kept
    assert level_metrics([lazy], slo_ttft_ms=300) == level_metrics([run], slo_ttft_ms=300)


# ------------------------------------------------------------------------------------------------ streamed
@dataclass
class _Result:
    success: bool = True
    status: int | None = 200
    error: str | None = None
    ttft_s: float | None = 0.002
    itl_s: list[float] = field(default_factory=lambda: [0.001, 0.001])
    chunk_tokens: list[int] = field(default_factory=lambda: [1, 2, 1])
    e2e_s: float | None = 0.004
    output_tokens: int | None = 4
    prompt_tokens: int | None = 9


def _requests(n: int) -> list[Request]:
    return [Request(id=f"q{i}", line=i + 1, arrival_s=0.002 * i, prompt="hi", max_tokens=4) for i in range(n)]


def _replay(requests: list[Request], fail_at: str | None = None, **kwargs: Any) -> LevelRun:
    async def send(request: Request) -> _Result:
        await asyncio.sleep(0.004)
        if request.id == fail_at:
            raise RuntimeError("client bug")
        return _Result()

    return asyncio.run(run_level(Replay(), plan(Replay(), requests), send, **kwargs))


def test_a_streamed_level_writes_each_record_as_it_completes(tmp_path: Path) -> None:
    path = tmp_path / "load" / "streamed.jsonl"
    seen: list[int] = []

    class Counting(RecordWriter):
        def add(self, record: LoadRecord) -> None:
            super().add(record)
            seen.append(len(path.read_text().splitlines()))  # already on disk: the header + every record so far

    with Counting(path) as writer:
        run = _replay(_requests(6), sink=writer, keep_records=False)
    assert seen == [2, 3, 4, 5, 6, 7]
    assert run.records == []
    assert run.requests == len(run.send_lags()) == 6
    assert not run.records_kept
    back = read_run(path)
    assert len(back.records) == 6
    assert [r.send_lag_s for r in back.records] == pytest.approx(run.send_lags(), abs=1e-6)
    assert (back.duration_s, back.peak_in_flight, back.started_at) == (run.duration_s, run.peak_in_flight,
                                                                         run.started_at)  # fmt: skip
    assert all(r.success and r.output_tokens == 4 and list(r.chunk_tokens) == [1, 2, 1] for r in back.records)
    with pytest.raises(ValueError, match="streamed to a sink, not kept"):
        level_metrics([run])
    with pytest.raises(ValueError, match="keep_records=False needs a sink"):
        _replay(_requests(1), keep_records=False)


def test_an_interrupted_level_leaves_its_records_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    with RecordWriter(path) as writer, pytest.raises(RuntimeError, match="client bug"):
        _replay(_requests(8), fail_at="q7", sink=writer, keep_records=False)  # the last: every other one completed
    with pytest.raises(UserInputError, match=r"x\.jsonl: an unfinished level \(7 records and no end line\)"):
        read_run(path)
    back = read_run(path, unfinished=True)
    assert sorted(r.request_id for r in back.records) == [f"q{i}" for i in range(7)]
    assert back.duration_s == max(r.done_s for r in back.records)
    assert back.peak_in_flight >= 1
    assert back.notes[-1].startswith("replay: an interrupted level: 7 records read back;")
    path.write_text(path.read_text() + '{"index":9,"request_id":"q')  # a write cut short
    back = read_run(path, unfinished=True, lazy=True)
    assert len(back.records) == len(list(back.records)) == 7
    assert "its last, torn line dropped" in back.notes[-1]


def test_peak_in_flight_of_an_unfinished_level() -> None:
    # sent/done: [0, 2], [1, 3], [2, 4] (a completion at 2 frees its slot before the send at 2), [2.5, 3]
    assert _peak_in_flight(array("d", [0, 2, 1, 3, 2, 4, 2.5, 3])) == 3
    assert _peak_in_flight(array("d")) == 0
