"""Format readers: each streams a file as `(line, native-shaped dict, field labels)` records.

Formats: `jsonl` (native), `csv`, `parquet`, `openai` (request logs), `sharegpt`. JSON-lines files are read
line by line with a 1 MiB cap per line (never a whole line in memory beyond that); CSV is read with the
standard library's csv module, which keeps exact line numbers even for quoted multi-line cells; Parquet is read
in record batches with pyarrow (pandas' Parquet engine), which keeps nulls distinct from NaN.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from runinfra_opt.errors import UserInputError
from runinfra_opt.workload.problems import Problems, describe

FORMATS = ("jsonl", "csv", "parquet", "openai", "sharegpt")
MAX_LINE_BYTES = 1 << 20
"""A request line (JSONL) or physical line (CSV) longer than this is reported, not parsed."""


@dataclass
class RawRecord:
    line: int
    data: dict[str, Any]
    labels: Mapping[str, str] = field(default_factory=dict)


def check_format(fmt: str) -> str:
    name = fmt.strip().lower()
    if name not in FORMATS:
        raise UserInputError(f"unknown format {fmt!r} (available: {', '.join(FORMATS)})")
    return name


# ---------------------------------------------------------------------------------------------- text lines
def _read_capped_line(fh: BinaryIO) -> tuple[bytes, int] | None:
    """The next line (with its terminator) and its full length; an over-long line is skipped, not returned."""
    raw = fh.readline(MAX_LINE_BYTES + 1)
    if not raw:
        return None
    if raw.endswith(b"\n") or len(raw) <= MAX_LINE_BYTES:
        return raw, len(raw)
    if raw.endswith(b"\r"):  # a line of exactly 1 MiB ending in \r\n
        nxt = fh.read(1)
        if nxt == b"\n":
            return raw + nxt, len(raw) + 1
        if nxt:
            fh.seek(-1, 1)
    total = len(raw)
    while True:  # drain the rest of the over-long line in small pieces
        more = fh.readline(1 << 16)
        total += len(more)
        if not more or more.endswith(b"\n"):
            return b"", total


def iter_lines(path: Path, problems: Problems) -> Iterator[tuple[int, str | None]]:
    """(line number, decoded text with terminator) per physical line; None for a line already reported bad."""
    with path.open("rb") as fh:
        lineno = 0
        while True:
            got = _read_capped_line(fh)
            if got is None:
                return
            raw, length = got
            lineno += 1
            if length and not raw:
                problems.add(lineno, "line", f"longer than 1 MiB ({length:,} bytes); a request line may have 1 MiB")
                yield lineno, None
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                column = len(raw[: exc.start].decode("utf-8", errors="replace")) + 1
                problems.add(lineno, "encoding", f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column {column})")
                yield lineno, None
                continue
            if lineno == 1 and text.startswith("\ufeff"):
                text = text[1:]
            yield lineno, text


# ---------------------------------------------------------------------------------------------- JSON values
def _is_json_array(path: Path) -> bool:
    with path.open("rb") as fh:
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"[")


def iter_json_values(path: Path, problems: Problems) -> Iterator[tuple[int, Any]]:
    """JSON values with their line: one per line (JSONL), or the elements of a top-level JSON array."""
    if _is_json_array(path):
        yield from _iter_json_array(path, problems)
        return
    for lineno, text in iter_lines(path, problems):
        if text is None or not text.strip():
            continue
        try:
            value = json.loads(text.rstrip("\r\n"))
        except json.JSONDecodeError as exc:
            problems.add(lineno, "json", f"invalid JSON at column {exc.colno}: {exc.msg}")
            continue
        yield lineno, value


def _iter_json_array(path: Path, problems: Problems) -> Iterator[tuple[int, Any]]:
    # A JSON array (the usual ShareGPT dump) cannot be streamed with the standard library: it is read whole.
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        problems.add(line, "encoding", f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at byte column {column})")
        return
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    line, counted_to = 1, 0

    def skip_ws(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    pos = skip_ws(pos)
    if pos < len(text) and text[pos] == "]":
        return
    while True:
        line += text.count("\n", counted_to, pos)
        counted_to = pos
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            problems.add(exc.lineno, "json", f"invalid JSON at column {exc.colno}: {exc.msg}")
            return
        yield line, value
        pos = skip_ws(end)
        if pos < len(text) and text[pos] == ",":
            pos = skip_ws(pos + 1)
            continue
        if pos < len(text) and text[pos] == "]":
            return
        err_line = text.count("\n", 0, pos) + 1
        column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        problems.add(err_line, "json", f"invalid JSON at column {column}: expecting ',' or ']' in the array")
        return


def _object(value: Any, line: int, problems: Problems) -> dict[str, Any] | None:
    if isinstance(value, dict):
        return value
    problems.add(line, "record", f"not a JSON object: each request is one {{...}} object, got {describe(value)}")
    return None


# ---------------------------------------------------------------------------------------------- detection
def json_shape(value: Any) -> str:
    """The format a JSON record looks like: `sharegpt`, `openai` or `jsonl` (native)."""
    if not isinstance(value, dict) or "messages" in value or "prompt" in value:
        return "jsonl"
    if isinstance(value.get("conversations"), list):
        return "sharegpt"
    if isinstance(value.get("request"), dict) or isinstance(value.get("body"), dict):
        return "openai"
    return "jsonl"


def detect_format(path: Path) -> str:
    """By extension (.csv, .parquet/.pq), else by the shape of the first JSON record."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    scratch = Problems(str(path))
    for _, value in iter_json_values(path, scratch):
        return json_shape(value)
    return "jsonl"


# ---------------------------------------------------------------------------------------------- readers
def read_records(path: Path, fmt: str, problems: Problems) -> Iterator[RawRecord]:
    """Stream a file's records in the given format as native-shaped dicts."""
    if fmt == "csv":
        yield from _read_csv(path, problems)
    elif fmt == "parquet":
        yield from _read_parquet(path, problems)
    else:
        convert = {"jsonl": _native, "openai": _from_openai, "sharegpt": _from_sharegpt}[fmt]
        conversations = Conversations()
        for line, value in iter_json_values(path, problems):
            data = _object(value, line, problems)
            if data is not None:
                record = convert(data, line, problems)
                if record is not None and fmt == "openai":
                    record = conversations.turn(record, problems)
                if record is not None:
                    yield record


def _native(data: dict[str, Any], line: int, problems: Problems) -> RawRecord | None:
    return RawRecord(line, data)


OPENAI_BODY_FIELDS = ("messages", "prompt", "max_tokens", "temperature", "top_p", "seed")


def _from_openai(data: dict[str, Any], line: int, problems: Problems) -> RawRecord | None:
    """`{"timestamp"?, "request": {chat.completions body}, "response"?: {...}}` (or batch `body`) -> native."""
    key = "request" if "request" in data else "body" if "body" in data else None
    body = data.get(key) if key else None
    if not isinstance(body, dict):
        got = "missing" if body is None else f"must be an object, got {describe(body)}"
        problems.add(line, key or "request", f'{got} (OpenAI request log: {{"request": {{chat.completions body}}}})')
        return None
    native: dict[str, Any] = {k: v for k, v in data.items() if k not in ("request", "body", "response")}
    if "id" not in native and isinstance(data.get("custom_id"), str):
        native["id"] = native.pop("custom_id")
    for name in OPENAI_BODY_FIELDS:
        if name in body:
            native[name] = body[name]
    if "max_tokens" not in body and "max_completion_tokens" in body:
        native["max_tokens"] = body["max_completion_tokens"]
    if isinstance(body.get("model"), str):
        native.setdefault("model", body["model"])
    if "response" in data and data["response"] is not None:
        text = _openai_response_text(data["response"])
        if text is None:
            problems.add(line, "response", "no text at response.choices[0].message.content (or .text)")
            return None
        native["response"] = text
    labels = {name: f"{key}.{name}" for name in OPENAI_BODY_FIELDS}
    return RawRecord(line, native, labels)


CONVERSATION_KEYS = ("conversation_id", "session_id", "thread_id")
"""Where an OpenAI request log names its conversation: at the top level or in `metadata` (first found)."""


class Conversations:
    """Turns OpenAI log records that name a conversation into a session's turns: each call of a chat API carries
    the whole conversation, so a later call's messages lose the previous call's messages and the assistant answer
    after them (the replay rebuilds that history from the answers the server gives)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, list[Any]]] = {}

    def turn(self, record: RawRecord, problems: Problems) -> RawRecord | None:
        data = record.data
        metadata: dict[str, Any] = data["metadata"] if isinstance(data.get("metadata"), dict) else {}
        key, conversation = next(
            ((k, v) for k in CONVERSATION_KEYS for v in (data.get(k), metadata.get(k)) if v is not None), (None, None)
        )
        if conversation is None or not isinstance(data.get("messages"), list):
            return record
        if not isinstance(conversation, str | int) or isinstance(conversation, bool):
            problems.add(record.line, str(key), f"must be a string, got {describe(conversation)}")
            return None
        session = str(conversation)
        messages = list(data["messages"])
        last = self._last.get(session)
        turn = 1 if last is None else last[0] + 1
        self._last[session] = (turn, messages)
        native = {k: v for k, v in data.items() if k not in (*CONVERSATION_KEYS, "metadata")}
        native.update(session_id=session, turn=turn)
        if last is not None:
            previous = last[1]
            answer = messages[len(previous)] if len(messages) > len(previous) else None
            answered = isinstance(answer, dict) and answer.get("role") == "assistant"
            if messages[: len(previous)] != previous or not answered:
                problems.add(
                    record.line,
                    record.labels.get("messages", "messages"),
                    f"does not continue conversation {session!r}: expected the previous call's messages, then its "
                    "assistant answer",
                )
                return None
            native["messages"] = messages[len(previous) + 1 :]
        return RawRecord(record.line, native, record.labels)


def _openai_response_text(response: Any) -> str | None:
    if isinstance(response, str):
        return response
    if not isinstance(response, dict):
        return None
    if isinstance(response.get("body"), dict):  # batch output: {"status_code", "body": {...}}
        response = response["body"]
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        return message["content"]
    if isinstance(choice.get("text"), str):
        return choice["text"]
    return None


SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "assistant": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
}


def _from_sharegpt(data: dict[str, Any], line: int, problems: Problems) -> RawRecord | None:
    """`{"conversations": [{"from", "value"}]}`: the first human turn (after any system turns) is the request,
    the gpt turn right after it the recorded response."""
    turns = data.get("conversations")
    if not isinstance(turns, list) or not turns:
        got = "missing" if turns is None else f"must be a non-empty list of {{from, value}}, got {describe(turns)}"
        problems.add(line, "conversations", got)
        return None
    messages: list[dict[str, str]] = []
    response: str | None = None
    for i, turn in enumerate(turns):
        where = f"conversations[{i}]"
        if not isinstance(turn, dict):
            problems.add(line, where, f"must be an object with from and value, got {describe(turn)}")
            return None
        role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
        if role is None:
            allowed = ", ".join(sorted(SHAREGPT_ROLES))
            problems.add(line, f"{where}.from", f"must be one of {allowed}; got {describe(turn.get('from'))}")
            return None
        value = turn.get("value")
        if not isinstance(value, str) or not value.strip():
            what = (
                "empty content" if isinstance(value, str) or value is None else f"must be text, got {describe(value)}"
            )
            problems.add(line, f"{where}.value", what)
            return None
        if role == "system" and not any(m["role"] == "user" for m in messages):
            messages.append({"role": "system", "content": value})
        elif role == "user" and not any(m["role"] == "user" for m in messages):
            messages.append({"role": "user", "content": value})
        elif role == "assistant" and messages and messages[-1]["role"] == "user" and response is None:
            response = value
            break
        elif role == "user":
            break
    if not any(m["role"] == "user" for m in messages):
        problems.add(line, "conversations", "no human turn to use as the request")
        return None
    native: dict[str, Any] = {k: v for k, v in data.items() if k != "conversations"}
    native["messages"] = messages
    if response is not None:
        native["response"] = response
    return RawRecord(line, native, {"messages": "conversations"})


# ---------------------------------------------------------------------------------------------- CSV
INT_FIELDS = ("max_tokens", "seed")
FLOAT_FIELDS = ("arrival_s", "temperature", "top_p")


def _csv_cell(name: str, text: str, line: int, problems: Problems) -> Any:
    """CSV cells are text: numbers for the numeric fields (left as text when they do not parse, so the
    record check reports them), JSON for `messages`, text otherwise."""
    if name in INT_FIELDS:
        for parse in (int, float):
            try:
                return parse(text)
            except ValueError:
                pass
        return text
    if name in FLOAT_FIELDS:
        try:
            return float(text)
        except ValueError:
            return text
    if name == "messages":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            problems.add(line, "messages", f"not a JSON list in the CSV cell (column {exc.colno}: {exc.msg})")
            return _BAD
    return text


_BAD = object()


def _read_csv(path: Path, problems: Problems) -> Iterator[RawRecord]:
    csv.field_size_limit(16 * MAX_LINE_BYTES)
    bad_lines: set[int] = set()
    current = [0]

    def lines() -> Iterator[str]:
        for lineno, text in iter_lines(path, problems):
            current[0] = lineno
            if text is None:
                bad_lines.add(lineno)
                yield "\n"
            else:
                yield text

    reader = csv.reader(lines())
    header: list[str] | None = None
    row_start = 1
    try:
        for row in reader:
            start, end = row_start, current[0]
            row_start = end + 1
            if any(n in bad_lines for n in range(start, end + 1)):
                continue
            if not row or all(not cell.strip() for cell in row):
                continue
            if header is None:
                header = [cell.strip() for cell in row]
                seen: set[str] = set()
                for name in header:
                    if not name:
                        problems.add(start, "header", "empty column name")
                    elif name in seen:
                        problems.add(start, "header", f"duplicate column {name!r}")
                    seen.add(name)
                continue
            if len(row) != len(header):
                problems.add(start, "row", f"has {len(row)} cells, the header has {len(header)}")
                continue
            data: dict[str, Any] = {}
            for name, cell in zip(header, row, strict=True):
                if cell == "":
                    continue  # an empty cell is an absent field
                value = _csv_cell(name, cell, start, problems)
                if value is _BAD:
                    data = {}
                    break
                data[name] = value
            if data:
                yield RawRecord(start, data)
    except csv.Error as exc:
        problems.add(current[0], "csv", f"cannot parse: {exc}")


# ---------------------------------------------------------------------------------------------- Parquet
def _read_parquet(path: Path, problems: Problems) -> Iterator[RawRecord]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        problems.add(None, "parquet", f"cannot read as Parquet: {exc}")
        return
    row = 0
    for batch in parquet.iter_batches(batch_size=4096):
        for item in batch.to_pylist():
            row += 1
            data = {k: v for k, v in item.items() if v is not None}
            for name in INT_FIELDS:  # pandas stores an integer column with gaps as float64
                value = data.get(name)
                if isinstance(value, float) and value.is_integer():
                    data[name] = int(value)
            if isinstance(data.get("messages"), str):
                try:
                    data["messages"] = json.loads(data["messages"])
                except json.JSONDecodeError as exc:
                    problems.add(row, "messages", f"not a JSON list (column {exc.colno}: {exc.msg})")
                    continue
            yield RawRecord(row, data)
