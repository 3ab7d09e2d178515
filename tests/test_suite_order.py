"""The suite's own schedule (tests/conftest.py): the files it names exist and are what it says they are, so that a
renamed file cannot silently drop out of the order."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FIRST_MODULE, GUARD_MODULE, LONGEST_QUIET

TESTS = Path(__file__).parent


def test_the_files_the_schedule_names_exist() -> None:
    for name in (FIRST_MODULE, GUARD_MODULE, *LONGEST_QUIET):
        assert (TESTS / name).is_file(), name


def test_the_longest_quiet_files_hold_quiet_tests() -> None:
    for name in LONGEST_QUIET:
        assert "pytest.mark.quiet" in (TESTS / name).read_text(encoding="utf-8"), name
