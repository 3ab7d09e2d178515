"""The typed request and workload that every other module consumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Message:
    role: str  # system | user | assistant | tool
    content: str


@dataclass(frozen=True)
class Request:
    """One recorded request. Exactly one of `messages` and `prompt` is set."""

    id: str
    line: int
    """1-based line (or row) in the source file, for error messages."""
    arrival_s: float | None = None
    """Seconds since the recording started; None when the file has no timing (back to back)."""
    category: str = "default"
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    response: str | None = None
    session_id: str | None = None
    """The conversation (or agent run) this request is a turn of; None for a request that stands alone."""
    turn: int | None = None
    """1 for a session's first turn; turn n+1 is sent only after turn n's answer (`runinfra_opt.workload.sessions`)."""
    think_s: float | None = None
    """Seconds between the previous turn's answer and this turn (None: 0)."""
    history_included: bool = False
    """True once `messages` hold the session's history (`SessionHistory.expand`); never read from a file."""
    copy: int = 0
    """Which repetition of the recorded request this is when a load level cycles the sample (`load.cycle`; 0:
    the recorded one); never read from a file."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Unknown fields, kept and ignored."""

    @property
    def greedy(self) -> bool:
        """Temperature 0 or absent means greedy decoding."""
        return not self.temperature

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    @property
    def continues_session(self) -> bool:
        """A later turn of a session: its prompt is the session's history (earlier turns and the answers they
        got) followed by its own messages."""
        return self.session_id is not None and (self.turn or 1) > 1

    def prompt_text(self) -> str:
        """The request's text without any chat template (for character-level statistics)."""
        if self.prompt is not None:
            return self.prompt
        return "\n".join(m.content for m in self.messages or ())


@dataclass(frozen=True)
class Workload:
    """A validated workload: its requests in file order, where it came from and its content fingerprint."""

    name: str
    """Bundled name (e.g. `mixed`) or the file's stem."""
    path: str
    requests: tuple[Request, ...]
    fingerprint: str
    """sha256 of the canonical content (see `runinfra_opt.workload.fingerprint`)."""
    format: str = "jsonl"
    default_max_tokens: int | None = None
    """The max_tokens given to requests that had none (command line, else the package default)."""
    max_tokens_defaulted: int = 0
    """How many requests got `default_max_tokens` because the file gave them none."""

    @property
    def fingerprint_short(self) -> str:
        """How the fingerprint is shown wherever a workload is named: `sha256:<first 12 hex>`."""
        return f"sha256:{self.fingerprint.removeprefix('sha256:')[:12]}"

    @property
    def categories(self) -> list[str]:
        return sorted({r.category for r in self.requests})
