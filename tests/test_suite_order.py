"""The suite's own schedule (tests/conftest.py): the files it names exist and are what it says they are, so that a
renamed file cannot silently drop out of the order."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FIRST_MODULE, GUARD_MODULE, LONGEST_QUIET, part_of

TESTS = Path(__file__).parent


def test_the_files_the_schedule_names_exist() -> None:
    for name in (FIRST_MODULE, GUARD_MODULE, *LONGEST_QUIET):
        assert (TESTS / name).is_file(), name


def test_the_longest_quiet_files_hold_quiet_tests() -> None:
    for name in LONGEST_QUIET:
        assert "pytest.mark.quiet" in (TESTS / name).read_text(encoding="utf-8"), name


def test_every_file_is_in_one_part_and_the_guard_in_all() -> None:
    quiet = {path.name for path in TESTS.glob("test_*.py") if "pytest.mark.quiet" in path.read_text(encoding="utf-8")}
    parts = {path.name: part_of(path.name, quiet) for path in TESTS.glob("test_*.py")}
    assert parts.pop(GUARD_MODULE) is None
    assert parts.pop(FIRST_MODULE) == "vllm"
    assert {name for name, part in parts.items() if part == "quiet"} == quiet
    assert set(parts.values()) == {"quiet", "rest"}
