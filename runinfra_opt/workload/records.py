"""Validation of one native-shaped record (a dict with the native JSONL fields) into a `Request`.

Every reader (JSONL, CSV, Parquet, OpenAI logs, ShareGPT) turns its rows into such dicts; the checks below
are therefore the same for every format. Problems are collected, not raised, so that a file's problems are
all reported at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from runinfra_opt.workload.model import Message, Request
from runinfra_opt.workload.problems import Problems, describe

KNOWN_FIELDS = (
    "id",
    "arrival_s",
    "timestamp",
    "category",
    "messages",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "response",
    "session_id",
    "turn",
    "think_s",
)
ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass
class Timing:
    """How the file's requests are timed, decided by the first request that says it (file-wide rule)."""

    mode: str | None = None
    """`arrival_s`, `timestamp` or `none` once the first request is seen."""
    first_line: int = 0
    earliest_timestamp: float | None = None


@dataclass
class RecordContext:
    """Per-file state shared by the record checks: problems, defaults, timing mode and ids seen."""

    problems: Problems
    default_max_tokens: int
    timing: Timing = field(default_factory=Timing)
    ids: dict[str, int] = field(default_factory=dict)
    max_tokens_defaulted: int = 0
    sessions: dict[str, tuple[int, int, float | None]] = field(default_factory=dict)
    """Per session: its last turn so far, that turn's line and its arrival (turns must come in order)."""


def _label(labels: Mapping[str, str], name: str) -> str:
    return labels.get(name, name)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_timestamp(value: object) -> float | str:
    """Unix seconds (number, numeric string) or ISO-8601 (naive means UTC) -> epoch seconds, else a problem."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        return moment.timestamp()
    if _is_number(value):
        seconds = float(value)  # type: ignore[arg-type]
        if not math.isfinite(seconds):
            return f"must be finite, got {describe(value)}"
        if seconds < 0:
            return f"must be >= 0 Unix seconds, got {describe(value)}"
        return seconds
    if isinstance(value, str):
        text = value.strip()
        try:
            return parse_timestamp(float(text))
        except ValueError:
            pass
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return f"not ISO-8601 or Unix seconds: {describe(value)}"
        return parse_timestamp(moment)
    return f"must be ISO-8601 text or Unix seconds, got {describe(value)}"


def _text_content(value: object) -> str | None:
    """Message content: a string, or OpenAI's list of text parts (joined). None if not text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        texts = [p.get("text") for p in value]
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)
    return None


def _messages(value: object, line: int, name: str, problems: Problems) -> tuple[Message, ...] | None:
    if not isinstance(value, list):
        problems.add(line, name, f"must be a list of {{role, content}} objects, got {describe(value)}")
        return None
    if not value:
        problems.add(line, name, "must not be empty")
        return None
    out: list[Message] = []
    ok = True
    for i, item in enumerate(value):
        where = f"{name}[{i}]"
        if not isinstance(item, dict):
            problems.add(line, where, f"must be an object with role and content, got {describe(item)}")
            ok = False
            continue
        role = item.get("role")
        if not isinstance(role, str) or role not in ROLES:
            problems.add(line, f"{where}.role", f"must be one of {', '.join(ROLES)}; got {describe(role)}")
            ok = False
        if "content" not in item or item["content"] is None:
            problems.add(line, f"{where}.content", "missing (every message needs text content)")
            ok = False
            continue
        content = _text_content(item["content"])
        if content is None:
            problems.add(
                line,
                f"{where}.content",
                f"must be text (a string or a list of text parts), got {describe(item['content'])}",
            )
            ok = False
        elif not content.strip():
            problems.add(line, f"{where}.content", "empty content")
            ok = False
        elif ok:
            out.append(Message(role=str(role), content=content))
    return tuple(out) if ok else None


def build_request(
    data: Mapping[str, Any], line: int, ctx: RecordContext, labels: Mapping[str, str] = {}
) -> Request | None:  # noqa: B006
    """Check one record; return its Request, or None after adding its problems to `ctx.problems`.

    `labels` renames fields in messages for formats whose fields sit elsewhere (OpenAI logs: `request.messages`).
    A `timestamp` is returned as absolute epoch seconds in `arrival_s`; the caller makes it relative.
    """
    problems = ctx.problems
    before = problems.total
    values = {k: v for k, v in data.items() if v is not None}

    request_id = f"line-{line}"
    if "id" in values:
        raw_id = values["id"]
        if isinstance(raw_id, int) and not isinstance(raw_id, bool):
            raw_id = str(raw_id)
        if not isinstance(raw_id, str) or not raw_id.strip():
            problems.add(line, _label(labels, "id"), f"must be a non-empty string, got {describe(values['id'])}")
        else:
            request_id = raw_id
    first = ctx.ids.get(request_id)
    if first is not None:
        problems.add(line, _label(labels, "id"), f"duplicate id {request_id!r} (also on line {first})")
    else:
        ctx.ids[request_id] = line

    arrival = _timing(values, line, ctx, labels)

    category = "default"
    if "category" in values:
        if isinstance(values["category"], str) and values["category"].strip():
            category = values["category"]
        else:
            problems.add(
                line, _label(labels, "category"), f"must be a non-empty string, got {describe(values['category'])}"
            )

    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    has_messages, has_prompt = "messages" in values, "prompt" in values
    if has_messages and has_prompt:
        problems.add(
            line,
            f"{_label(labels, 'prompt')}/{_label(labels, 'messages')}",
            "give exactly one of prompt and messages, not both",
        )
    elif not has_messages and not has_prompt:
        problems.add(
            line,
            f"{_label(labels, 'prompt')}/{_label(labels, 'messages')}",
            "missing: give exactly one of prompt (text) and messages (chat)",
        )
    elif has_messages:
        messages = _messages(values["messages"], line, _label(labels, "messages"), problems)
    elif not isinstance(values["prompt"], str):
        problems.add(line, _label(labels, "prompt"), f"must be a string, got {describe(values['prompt'])}")
    elif not values["prompt"].strip():
        problems.add(line, _label(labels, "prompt"), "empty prompt")
    else:
        prompt = values["prompt"]

    max_tokens = ctx.default_max_tokens
    if "max_tokens" in values:
        value = values["max_tokens"]
        if not isinstance(value, int) or isinstance(value, bool):
            problems.add(line, _label(labels, "max_tokens"), f"must be an integer > 0, got {describe(value)}")
        elif value <= 0:
            problems.add(line, _label(labels, "max_tokens"), f"must be > 0, got {value}")
        else:
            max_tokens = value
    defaulted = "max_tokens" not in values

    temperature = _number(values, "temperature", line, problems, labels, low=0.0, high=None)
    top_p = _number(values, "top_p", line, problems, labels, low=0.0, high=1.0, low_open=True)
    seed: int | None = None
    if "seed" in values:
        if isinstance(values["seed"], int) and not isinstance(values["seed"], bool):
            seed = values["seed"]
        else:
            problems.add(line, _label(labels, "seed"), f"must be an integer, got {describe(values['seed'])}")

    response: str | None = None
    if "response" in values:
        if isinstance(values["response"], str):
            response = values["response"]
        else:
            problems.add(line, _label(labels, "response"), f"must be a string, got {describe(values['response'])}")

    session_id, turn, think_s = _session(values, line, ctx, labels, arrival, has_prompt)

    if problems.total > before:
        return None
    if defaulted:
        ctx.max_tokens_defaulted += 1
    extra = {k: v for k, v in data.items() if k not in KNOWN_FIELDS}
    return Request(
        id=request_id,
        line=line,
        arrival_s=arrival,
        category=category,
        messages=messages,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        response=response,
        session_id=session_id,
        turn=turn,
        think_s=think_s,
        extra=extra,
    )


def _session(
    values: Mapping[str, Any],
    line: int,
    ctx: RecordContext,
    labels: Mapping[str, str],
    arrival: float | None,
    is_prompt: bool,
) -> tuple[str | None, int | None, float | None]:
    """`session_id`, `turn` and `think_s`: a session's turns come in file order, 1, 2, 3, ... (a turn without its
    predecessor, or a turn number seen before, is a problem), never arriving before their predecessor."""
    problems = ctx.problems
    think_s = _number(values, "think_s", line, problems, labels, low=0.0, high=None)
    has_session, has_turn = "session_id" in values, "turn" in values
    if not has_session:
        if has_turn:
            problems.add(line, _label(labels, "turn"), "given without session_id: a turn belongs to a session")
        elif think_s is not None:
            problems.add(line, _label(labels, "think_s"), "given without session_id: only a session's turns wait")
        return None, None, None
    session_id = values["session_id"]
    if isinstance(session_id, int) and not isinstance(session_id, bool):
        session_id = str(session_id)
    if not isinstance(session_id, str) or not session_id.strip():
        problems.add(line, _label(labels, "session_id"), f"must be a non-empty string, got {describe(session_id)}")
        return None, None, None
    turn = values.get("turn")
    if not has_turn:
        problems.add(line, _label(labels, "turn"), "missing: a session's request needs its turn (1 for the first)")
        return None, None, None
    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 1:
        problems.add(line, _label(labels, "turn"), f"must be an integer >= 1, got {describe(turn)}")
        return None, None, None
    if is_prompt:
        problems.add(line, _label(labels, "prompt"), "a session's turns are chat: give messages, not prompt")
    last = ctx.sessions.get(session_id)
    last_turn = last[0] if last else 0
    if turn <= last_turn:
        assert last is not None
        where = f"also on line {last[1]}" if turn == last_turn else f"turn {last_turn} was on line {last[1]}"
        problems.add(line, _label(labels, "turn"), f"duplicate turn {turn} of session {session_id!r} ({where})")
    elif turn > last_turn + 1:
        before = f"its last turn so far is {last_turn} on line {last[1]}" if last else "it has no earlier turn"
        problems.add(
            line,
            _label(labels, "turn"),
            f"turn {turn} of session {session_id!r} has no turn {turn - 1} before it in the file ({before})",
        )
    elif last is not None and arrival is not None and last[2] is not None and arrival < last[2]:
        problems.add(
            line,
            _label(labels, "arrival_s"),
            f"turn {turn} of session {session_id!r} arrives before turn {last_turn} (line {last[1]})",
        )
    else:
        ctx.sessions[session_id] = (turn, line, arrival)
    return session_id, turn, think_s


def _number(
    values: Mapping[str, Any],
    name: str,
    line: int,
    problems: Problems,
    labels: Mapping[str, str],
    *,
    low: float,
    high: float | None,
    low_open: bool = False,
) -> float | None:
    if name not in values:
        return None
    value = values[name]
    label = _label(labels, name)
    if not _is_number(value) or not math.isfinite(value):
        problems.add(line, label, f"must be a finite number, got {describe(value)}")
        return None
    number = float(value)
    if number < low or (low_open and number == low) or (high is not None and number > high):
        bounds = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if high is not None else "")
        problems.add(line, label, f"must be {bounds}, got {value}")
        return None
    return number


def _timing(values: Mapping[str, Any], line: int, ctx: RecordContext, labels: Mapping[str, str]) -> float | None:
    problems, timing = ctx.problems, ctx.timing
    has_arrival, has_timestamp = "arrival_s" in values, "timestamp" in values
    if has_arrival and has_timestamp:
        problems.add(line, _label(labels, "arrival_s"), "give arrival_s or timestamp, not both")
        return None
    mode = "arrival_s" if has_arrival else "timestamp" if has_timestamp else "none"
    if timing.mode is None:
        timing.mode, timing.first_line = mode, line
    elif mode != timing.mode:
        if mode == "none":
            what = f"missing, but line {timing.first_line} has {timing.mode}: time every request or none"
            problems.add(line, _label(labels, timing.mode), what)
        elif timing.mode == "none":
            what = f"line {timing.first_line} has no time: time every request or none"
            problems.add(line, _label(labels, mode), what)
        else:
            what = f"line {timing.first_line} uses {timing.mode}: use one of arrival_s and timestamp for the whole file"
            problems.add(line, _label(labels, mode), what)
        return None
    if has_arrival:
        value = values["arrival_s"]
        if not _is_number(value):
            problems.add(line, _label(labels, "arrival_s"), f"must be a number of seconds, got {describe(value)}")
        elif not math.isfinite(value):
            problems.add(line, _label(labels, "arrival_s"), f"must be finite, got {describe(value)}")
        elif value < 0:
            problems.add(line, _label(labels, "arrival_s"), f"must be >= 0, got {value}")
        else:
            return float(value)
        return None
    if has_timestamp:
        parsed = parse_timestamp(values["timestamp"])
        if isinstance(parsed, str):
            problems.add(line, _label(labels, "timestamp"), parsed)
            return None
        if timing.earliest_timestamp is None or parsed < timing.earliest_timestamp:
            timing.earliest_timestamp = parsed
        return parsed
    return None
