"""Raw load records survive a round trip to disk; a corrupt file is one clear error naming its line."""

from __future__ import annotations

from array import array
from pathlib import Path

import pytest

from runinfra_opt.errors import UserInputError
from runinfra_opt.load import Concurrency, LevelRun, LoadRecord, Rate, Replay
from runinfra_opt.load.store import read_run, write_run


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
    write_run(path, LevelRun(Concurrency(1), [_record(0)], 0.0, 1.0, 1))
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(UserInputError, match=r"x\.jsonl: line 3: not a load record"):
        read_run(path)
