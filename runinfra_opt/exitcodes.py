"""The process exit codes, defined in one place (the README lists them)."""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    """Success (for `optimize`: the manifest was written)."""
    INTERNAL = 1
    """An unexpected internal error (a bug: please report it)."""
    BAD_INPUT = 2
    """Bad usage or bad input: a malformed file, an unknown model, an impossible option."""
    NO_FEASIBLE = 3
    """`optimize`: no variant, not even the baseline, satisfies the constraints; no manifest written."""
    GATE_FAILED = 4
    """A CI gate failed: `optimize --require-speedup` when the baseline wins, or
    `report --compare --max-regression` when the new run regressed beyond noise."""
    ENGINE_FAILED = 5
    """A serving engine (vLLM) is missing or broken, or could not be installed or started."""
    WRITE_FAILED = 6
    """A file could not be written (disk full, quota, file-size limit, read-only); what was written before is
    intact (`optimize --resume` continues once there is room)."""
    INTERRUPTED = 130
    """Interrupted by SIGINT (Ctrl-C); what was finished is kept on disk (`optimize --resume` continues)."""
    TERMINATED = 143
    """Terminated by SIGTERM (how CI systems cancel a job); what was finished is kept on disk."""
