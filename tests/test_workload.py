"""Workload reading through the real CLI: every input format, every bad-input case, convert and list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from runinfra_opt.cli.app import app
from runinfra_opt.workload import load_workload, validate_workload
from runinfra_opt.workload import loader as loader_module

FIXTURES = Path(__file__).parent / "workload_fixtures"

# The same three requests in every fixture format: their fingerprints must all agree.
REQUESTS = [
    {
        "id": "q1",
        "arrival_s": 0.0,
        "category": "chat",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        "max_tokens": 32,
        "response": "The capital of France is Paris.",
    },
    {
        "id": "q2",
        "arrival_s": 1.5,
        "category": "code",
        "messages": [{"role": "user", "content": "Rename x to count in:\ndef f(x):\n    return x + 1"}],
        "max_tokens": 64,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 7,
        "response": "def f(count):\n    return count + 1",
    },
    {
        "id": "q3",
        "arrival_s": 4.25,
        "category": "chat",
        "messages": [{"role": "user", "content": "Say hi"}],
        "response": "Hi!",
    },
]


def workload_cli(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(app, ["workload", *args])


def assert_bad_input(result: Result, *lines: str) -> None:
    """Exit 2, every expected `error: ...` line on stderr, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for line in lines:
        assert f"error: {line}" in result.stderr, f"missing {line!r} in:\n{result.stderr}"


def write_parquet(path: Path, *, messages_as_json: bool = True) -> Path:
    import pandas as pd

    rows = []
    for request in REQUESTS:
        row = dict(request)
        row["messages"] = json.dumps(request["messages"]) if messages_as_json else request["messages"]
        rows.append(row)
    pd.DataFrame(rows).to_parquet(path)
    return path


@pytest.fixture(scope="module")
def native_fingerprint() -> str:
    return load_workload(str(FIXTURES / "native.jsonl")).fingerprint


# ------------------------------------------------------------------------------------------ formats
@pytest.mark.parametrize(
    ("name", "fmt"),
    [("native.jsonl", "jsonl"), ("native.csv", "csv"), ("openai.jsonl", "openai"), ("sharegpt.json", "sharegpt")],
)
def test_every_format_is_detected_and_gives_the_same_fingerprint(
    runner: CliRunner, native_fingerprint: str, name: str, fmt: str
) -> None:
    result = workload_cli(runner, "validate", str(FIXTURES / name))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"ok: 3 requests, fingerprint sha256:{native_fingerprint[:12]} ({fmt},")
    # --format names the same format explicitly
    result = workload_cli(runner, "validate", str(FIXTURES / name), "--format", fmt)
    assert result.exit_code == 0, result.output


def test_one_request_reads_as_one(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text('{"id": "a", "prompt": "hi"}\n', encoding="utf-8")
    result = workload_cli(runner, "validate", str(path))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok: 1 request, fingerprint sha256:")
    assert result.stdout.rstrip().endswith("(jsonl, 1 category)")


@pytest.mark.parametrize("messages_as_json", [True, False])
def test_parquet_written_by_pandas(
    runner: CliRunner, tmp_path: Path, native_fingerprint: str, messages_as_json: bool
) -> None:
    path = write_parquet(tmp_path / "traffic.parquet", messages_as_json=messages_as_json)
    result = workload_cli(runner, "validate", str(path))
    assert result.exit_code == 0, result.output
    assert f"ok: 3 requests, fingerprint sha256:{native_fingerprint[:12]} (parquet," in result.stdout


def test_sharegpt_as_jsonl(runner: CliRunner, tmp_path: Path, native_fingerprint: str) -> None:
    records = json.loads((FIXTURES / "sharegpt.json").read_text())
    path = tmp_path / "sharegpt.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = workload_cli(runner, "validate", str(path))
    assert result.exit_code == 0, result.output
    assert f"sha256:{native_fingerprint[:12]} (sharegpt," in result.stdout


def test_loaded_requests_carry_every_field() -> None:
    workload = load_workload(str(FIXTURES / "native.jsonl"), default_max_tokens=50)
    q1, q2, q3 = workload.requests
    assert [r.id for r in workload.requests] == ["q1", "q2", "q3"]
    assert [r.line for r in workload.requests] == [1, 3, 4]  # the blank line 2 is skipped but counted
    assert q1.messages is not None
    assert q1.messages[0].role == "system"
    assert q1.extra == {"user": "u-17"}  # unknown fields are kept
    assert (q2.temperature, q2.top_p, q2.seed, q2.greedy) == (0.7, 0.9, 7, False)
    assert q1.greedy
    assert q3.greedy
    assert q3.max_tokens == 50
    assert workload.max_tokens_defaulted == 1
    assert load_workload(str(FIXTURES / "native.jsonl")).requests[2].max_tokens == 128
    assert q2.response == "def f(count):\n    return count + 1"


def test_timestamps_become_arrival_relative_to_the_earliest() -> None:
    for name in ("openai.jsonl", "native.csv"):
        workload = load_workload(str(FIXTURES / name))
        assert [r.arrival_s for r in workload.requests] == [0.0, 1.5, 4.25], name


def test_openai_log_maps_request_and_response() -> None:
    workload = load_workload(str(FIXTURES / "openai.jsonl"))
    q1, q2, _ = workload.requests
    assert q1.messages is not None
    assert q1.messages[1].content == "What is the capital of France?"
    assert q1.response == "The capital of France is Paris."
    assert q2.max_tokens == 64  # max_completion_tokens
    assert q1.extra["model"] == "gpt-4o-mini"


def test_sharegpt_uses_first_human_turn_and_next_gpt_turn() -> None:
    q1 = load_workload(str(FIXTURES / "sharegpt.json")).requests[0]
    assert q1.messages is not None
    assert [(m.role, m.content) for m in q1.messages] == [
        ("system", "You are terse."),
        ("user", "What is the capital of France?"),
    ]
    assert q1.response == "The capital of France is Paris."


def test_prompt_requests_and_no_timing(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl"
    path.write_text('{"prompt": "Once upon a time"}\n{"prompt": "def add(a, b):", "max_tokens": 9}\n')
    workload = load_workload(str(path))
    assert [r.id for r in workload.requests] == ["line-1", "line-2"]
    assert [r.arrival_s for r in workload.requests] == [None, None]
    assert workload.requests[0].prompt == "Once upon a time"
    assert not workload.requests[0].is_chat


def test_fingerprint_ignores_whitespace_key_order_and_unknown_fields(tmp_path: Path) -> None:
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_text('{"id": "x", "prompt": "hello", "max_tokens": 4}\n')
    b.write_text('\n  {"max_tokens":4,"prompt":"hello","id":"x","note":"ignored"}  \n\n')
    assert load_workload(str(a)).fingerprint == load_workload(str(b)).fingerprint
    c = tmp_path / "c.jsonl"
    c.write_text('{"id": "x", "prompt": "hello!", "max_tokens": 4}\n')
    assert load_workload(str(c)).fingerprint != load_workload(str(a)).fingerprint


# ------------------------------------------------------------------------------------------ bad input
BAD_CASES = [
    pytest.param(b"", ["{f}: file: empty file: a workload needs at least one request"], id="empty-file"),
    pytest.param(b"\n\n  \n", ["{f}: file: no requests in the file (read as jsonl)"], id="blank-lines-only"),
    pytest.param(
        b'{"prompt": "a"}\n{"prompt": "b",, "x": 1}\n',
        ["{f}:2: json: invalid JSON at column 16: Expecting property name enclosed in double quotes"],
        id="invalid-json",
    ),
    pytest.param(
        b'{"prompt": "a"}\n["not", "an", "object"]\n"text"\n',
        [
            "{f}:2: record: not a JSON object: each request is one {{...}} object, got a list",
            "{f}:3: record: not a JSON object: each request is one {{...}} object, got 'text' (a string)",
        ],
        id="not-an-object",
    ),
    pytest.param(
        b'{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}\n{"id": "x"}\n',
        [
            "{f}:1: prompt/messages: give exactly one of prompt and messages, not both",
            "{f}:2: prompt/messages: missing: give exactly one of prompt (text) and messages (chat)",
        ],
        id="both-or-neither",
    ),
    pytest.param(
        b'{"messages": [{"role": "user", "content": "  "}]}\n{"prompt": ""}\n{"messages": []}\n'
        b'{"messages": [{"role": "user"}]}\n',
        [
            "{f}:1: messages[0].content: empty content",
            "{f}:2: prompt: empty prompt",
            "{f}:3: messages: must not be empty",
            "{f}:4: messages[0].content: missing (every message needs text content)",
        ],
        id="empty-content",
    ),
    pytest.param(
        b'{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "x"}]}\n',
        ["{f}:1: messages[1].role: must be one of system, developer, user, assistant, tool; got 'robot' (a string)"],
        id="bad-role",
    ),
    pytest.param(
        b'{"id": ["a"], "prompt": 5, "category": 3, "temperature": "hot", "seed": 1.5, "response": 7}\n'
        b'{"messages": "hello"}\n{"messages": ["hello"]}\n{"prompt": "p", "top_p": 0}\n',
        [
            "{f}:1: id: must be a non-empty string, got a list",
            "{f}:1: category: must be a non-empty string, got 3 (an integer)",
            "{f}:1: prompt: must be a string, got 5 (an integer)",
            "{f}:1: temperature: must be a finite number, got 'hot' (a string)",
            "{f}:1: seed: must be an integer, got 1.5 (a number)",
            "{f}:1: response: must be a string, got 7 (an integer)",
            "{f}:2: messages: must be a list of {{role, content}} objects, got 'hello' (a string)",
            "{f}:3: messages[0]: must be an object with role and content, got 'hello' (a string)",
            "{f}:4: top_p: must be > 0 and <= 1, got 0",
        ],
        id="wrong-types",
    ),
    pytest.param(
        b'{"prompt": "a", "max_tokens": 0}\n{"prompt": "b", "max_tokens": -3}\n{"prompt": "c", "max_tokens": true}\n'
        b'{"prompt": "d", "max_tokens": 12.0}\n{"prompt": "e", "max_tokens": "12"}\n',
        [
            "{f}:1: max_tokens: must be > 0, got 0",
            "{f}:2: max_tokens: must be > 0, got -3",
            "{f}:3: max_tokens: must be an integer > 0, got true (a boolean)",
            "{f}:4: max_tokens: must be an integer > 0, got 12.0 (a number)",
            "{f}:5: max_tokens: must be an integer > 0, got '12' (a string)",
        ],
        id="max-tokens",
    ),
    pytest.param(
        b'{"prompt": "a", "arrival_s": -1}\n{"prompt": "b", "arrival_s": NaN}\n{"prompt": "c", "arrival_s": Infinity}\n'
        b'{"prompt": "d", "arrival_s": "soon"}\n',
        [
            "{f}:1: arrival_s: must be >= 0, got -1",
            "{f}:2: arrival_s: must be finite, got nan (a number)",
            "{f}:3: arrival_s: must be finite, got inf (a number)",
            "{f}:4: arrival_s: must be a number of seconds, got 'soon' (a string)",
        ],
        id="arrival",
    ),
    pytest.param(
        b'{"prompt": "a", "timestamp": "yesterday"}\n{"prompt": "b", "timestamp": "2024-05-01T10:00:00Z", '
        b'"arrival_s": 1}\n{"prompt": "c"}\n{"prompt": "d", "arrival_s": 2}\n',
        [
            "{f}:1: timestamp: not ISO-8601 or Unix seconds: 'yesterday' (a string)",
            "{f}:2: arrival_s: give arrival_s or timestamp, not both",
            "{f}:3: timestamp: missing, but line 1 has timestamp: time every request or none",
            "{f}:4: arrival_s: line 1 uses timestamp: use one of arrival_s and timestamp for the whole file",
        ],
        id="timestamp-and-mixed-timing",
    ),
    pytest.param(
        b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "y"}\n{"id": "a", "prompt": "z"}\n{"prompt": "w"}\n'
        b'{"id": "line-4", "prompt": "v"}\n',
        [
            "{f}:3: id: duplicate id 'a' (also on line 1)",
            "{f}:5: id: duplicate id 'line-4' (also on line 4)",
        ],
        id="duplicate-ids",
    ),
    pytest.param(
        b'{"prompt": "ok"}\n{"prompt": "caf\xe9 au lait"}\n',
        ["{f}:2: encoding: not valid UTF-8 (byte 0xe9 at column 16)"],
        id="non-utf8",
    ),
    pytest.param(
        b'{"prompt": "ok"}\n{"prompt": "' + b"x" * (1 << 20) + b'"}\n{"prompt": "after"}\n',
        ["{f}:2: line: longer than 1 MiB (1,048,591 bytes); a request line may have 1 MiB"],
        id="line-over-1MiB",
    ),
]


@pytest.mark.parametrize(("content", "expected"), BAD_CASES)
def test_bad_input_is_reported_with_file_line_and_field(
    runner: CliRunner, tmp_path: Path, content: bytes, expected: list[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    for command in ("validate", "inspect"):
        result = workload_cli(runner, command, str(path))
        assert_bad_input(result, *(line.format(f=path) for line in expected))
    # exactly these problems, no others
    assert len(result.stderr.strip().splitlines()) == len(expected), result.stderr


def test_more_than_20_problems_are_counted(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "many.jsonl"
    path.write_text("".join('{"prompt": "p", "max_tokens": 0}\n' for _ in range(25)))
    result = workload_cli(runner, "validate", str(path))
    assert_bad_input(result, f"{path}:1: max_tokens: must be > 0, got 0", f"{path}:20: max_tokens: must be > 0, got 0")
    assert f"{path}:21:" not in result.stderr
    assert "error: ... and 5 more problem(s) not shown" in result.stderr


def test_bad_paths_and_names(runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundled = tmp_path / "bundled"
    bundled.mkdir()
    (bundled / "chat.jsonl").write_text('{"prompt": "hi"}\n')
    (bundled / "code.jsonl").write_text('{"prompt": "def"}\n')
    monkeypatch.setattr(loader_module, "bundled_dir", lambda: bundled)
    missing = tmp_path / "missing.jsonl"
    assert_bad_input(workload_cli(runner, "validate", str(missing)), f"{missing}: no such file")
    assert_bad_input(workload_cli(runner, "inspect", str(tmp_path)), f"{tmp_path}: is a directory, not a workload file")
    assert_bad_input(
        workload_cli(runner, "validate", "nosuch"),
        "unknown workload 'nosuch': not a file, and not a bundled workload (available: chat, code)",
    )


def test_unknown_format(runner: CliRunner) -> None:
    result = workload_cli(runner, "validate", str(FIXTURES / "native.jsonl"), "--format", "xml")
    assert_bad_input(result, "unknown format 'xml' (available: jsonl, csv, parquet, openai, sharegpt)")


def test_bad_csv(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(
        "id,prompt,messages,max_tokens,arrival_s\n"
        'a,"multi\nline prompt",,12,0\n'
        "b,,not json,5,1\n"
        "c,p,,12.5,2\n"
        "d,p,,abc,x\n"
        "e,p,,4\n"
        "a,p,,4,3\n"
    )
    result = workload_cli(runner, "validate", str(path))
    assert_bad_input(
        result,
        f"{path}:4: messages: not a JSON list in the CSV cell (column 1: Expecting value)",
        f"{path}:5: max_tokens: must be an integer > 0, got 12.5 (a number)",
        f"{path}:6: arrival_s: must be a number of seconds, got 'x' (a string)",
        f"{path}:6: max_tokens: must be an integer > 0, got 'abc' (a string)",
        f"{path}:7: row: has 4 cells, the header has 5",
        f"{path}:8: id: duplicate id 'a' (also on line 2)",
    )


def test_bad_csv_encoding(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"prompt\nfine\ncaf\xe9\nalso fine\n")
    assert_bad_input(
        workload_cli(runner, "validate", str(path)), f"{path}:3: encoding: not valid UTF-8 (byte 0xe9 at column 4)"
    )


def test_bad_parquet(runner: CliRunner, tmp_path: Path) -> None:
    import pandas as pd

    path = tmp_path / "bad.parquet"
    pd.DataFrame(
        [
            {"prompt": "fine", "max_tokens": 5, "messages": None},
            {"prompt": None, "max_tokens": -1, "messages": '[{"role": "user", "content": ""}]'},
            {"prompt": "half", "max_tokens": 2.5, "messages": None},
        ]
    ).to_parquet(path)
    assert_bad_input(
        workload_cli(runner, "validate", str(path)),
        f"{path}:2: max_tokens: must be > 0, got -1",
        f"{path}:2: messages[0].content: empty content",
        f"{path}:3: max_tokens: must be an integer > 0, got 2.5 (a number)",
    )
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not a parquet file")
    result = workload_cli(runner, "validate", str(garbage))
    assert result.exit_code == 2
    assert f"error: {garbage}: parquet: cannot read as Parquet:" in result.stderr


def test_bad_openai_log(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    lines = [
        {"request": {"messages": [{"role": "user", "content": "hi"}]}, "response": {"choices": []}},
        {"request": {"messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 0}},
        {"request": "POST /v1/chat/completions"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert_bad_input(
        workload_cli(runner, "validate", str(path)),
        f"{path}:1: response: no text at response.choices[0].message.content (or .text)",
        f"{path}:2: request.messages[0].role: must be one of system, developer, user, assistant, tool; got 'wizard'",
        f"{path}:2: request.max_tokens: must be > 0, got 0",
        f"{path}:3: request: must be an object, got 'POST /v1/chat/completions' (a string)",
    )


def test_bad_sharegpt(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "sg.json"
    path.write_text(
        json.dumps(
            [
                {"conversations": [{"from": "gpt", "value": "hello"}]},
                {"conversations": [{"from": "alien", "value": "x"}]},
                {"conversations": [{"from": "human", "value": ""}]},
                {"id": 3},
            ],
            indent=1,
        )
    )
    # json.dumps(indent=1) puts the four records on lines 2, 10, 18 and 26
    assert_bad_input(
        workload_cli(runner, "validate", str(path), "--format", "sharegpt"),
        f"{path}:2: conversations: no human turn to use as the request",
        f"{path}:10: conversations[0].from: must be one of",
        f"{path}:18: conversations[0].value: empty content",
        f"{path}:26: conversations: missing",
    )


def test_format_mismatch_names_the_format(runner: CliRunner) -> None:
    result = workload_cli(runner, "validate", str(FIXTURES / "native.jsonl"), "--format", "openai")
    assert_bad_input(result, f"{FIXTURES / 'native.jsonl'}:1: request: missing (OpenAI request log:")


def test_bad_max_tokens_option(runner: CliRunner) -> None:
    result = workload_cli(runner, "validate", str(FIXTURES / "native.jsonl"), "--max-tokens", "0")
    assert_bad_input(result, "--max-tokens: must be an integer > 0, got 0")


# ------------------------------------------------------------------------------------------ convert
def test_convert_writes_native_jsonl_with_the_same_fingerprint(
    runner: CliRunner, tmp_path: Path, native_fingerprint: str
) -> None:
    out = tmp_path / "out" / "converted.jsonl"
    result = workload_cli(runner, "convert", str(FIXTURES / "openai.jsonl"), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}: 3 requests from openai, fingerprint sha256:{native_fingerprint[:12]}" in result.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["arrival_s"] for r in records] == [0.0, 1.5, 4.25]
    assert records[0]["model"] == "gpt-4o-mini"  # unknown fields travel along
    assert validate_workload(str(out)).fingerprint == native_fingerprint
    assert [p.name for p in out.parent.iterdir()] == ["converted.jsonl"]  # no temp file left


def test_convert_refuses_bad_targets(runner: CliRunner, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text((FIXTURES / "native.jsonl").read_text())
    assert_bad_input(
        workload_cli(runner, "convert", str(source), "--out", str(source)),
        f"{source}: is the input file; write the converted workload elsewhere",
    )
    assert source.read_text() == (FIXTURES / "native.jsonl").read_text()
    assert_bad_input(
        workload_cli(runner, "convert", str(source), "--out", str(tmp_path / "out.csv")),
        f"{tmp_path / 'out.csv'}: --out must end in .jsonl (convert writes the native JSONL format)",
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": ""}\n')
    out = tmp_path / "never.jsonl"
    assert_bad_input(workload_cli(runner, "convert", str(bad), "--out", str(out)), f"{bad}:1: prompt: empty prompt")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "in.jsonl"]


# ------------------------------------------------------------------------------------------ bundled names
def test_bundled_names_work_everywhere(runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundled = tmp_path / "workloads"
    bundled.mkdir()
    (bundled / "mixed.jsonl").write_text((FIXTURES / "native.jsonl").read_text())
    monkeypatch.setattr(loader_module, "bundled_dir", lambda: bundled)
    monkeypatch.chdir(tmp_path)
    result = workload_cli(runner, "validate", "mixed")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok: 3 requests")
    result = workload_cli(runner, "inspect", "mixed", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "mixed"
    (bundled / "history").mkdir()
    (bundled / "history" / "mixed.jsonl").write_text((FIXTURES / "native.jsonl").read_text())
    result = workload_cli(runner, "validate", "history/mixed")
    assert result.exit_code == 0, result.output
    result = workload_cli(runner, "validate", "history/other")
    assert result.exit_code == 2
    assert "unknown workload 'history/other'" in result.output
    assert "mixed, history/mixed" in result.output
    result = workload_cli(runner, "convert", "mixed", "--out", "copy.jsonl")
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["workload", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "mixed" in result.stdout
    assert "all four interleaved" in result.stdout
    assert "chat 2, code 1" in result.stdout
    listed = json.loads(workload_cli(runner, "list", "--json").stdout)
    assert listed[0]["name"] == "mixed"
    assert listed[0]["requests"] == 3
    assert listed[1]["name"] == "history/mixed"


def test_a_file_wins_over_a_bundled_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mixed").write_text('{"prompt": "local file"}\n')
    assert load_workload("mixed").requests[0].prompt == "local file"


# ------------------------------------------------------------------------------------------ the bundled samples
BUNDLED = ("agent", "chat", "code", "json", "mixed", "summarize", "history/agent", "history/mixed")


def test_the_bundled_workloads_are_listed() -> None:
    from runinfra_opt.workload import DEFAULT_WORKLOAD, list_bundled

    infos = list_bundled()
    assert [info.name for info in infos] == list(BUNDLED)
    assert DEFAULT_WORKLOAD in BUNDLED
    for info in infos:
        assert info.requests >= (12 if info.name.startswith("history/") else 24), info.name
        assert info.description


@pytest.mark.parametrize("name", BUNDLED)
def test_every_bundled_workload_inspects_as_a_table(runner: CliRunner, name: str) -> None:
    result = runner.invoke(app, ["workload", "inspect", name], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert f"workload {name} (sha256:" in result.stdout
    for title in ("Traffic", "Lengths (characters)", "Per category"):
        assert title in result.stdout


def test_the_agent_workload_is_sessions_of_three_kinds_with_a_history_of_its_own() -> None:
    from runinfra_opt.workload.fingerprint import prompt_digest

    agent, history = load_workload("agent"), load_workload("history/agent")
    for workload in (agent, history):
        assert {r.category for r in workload.requests} == {"edit", "tool", "json"}
        assert all(r.session_id is not None for r in workload.requests)
        assert max(r.turn or 0 for r in workload.requests) == 3
    assert not {prompt_digest(r) for r in history.requests} & {prompt_digest(r) for r in agent.requests}


def test_the_bundled_history_is_other_traffic_of_the_samples_kinds() -> None:
    """The demo distils drafts from history/mixed and measures them on mixed: same categories, no shared
    prompt (a shared one would be left out of the measurement as trained-on), enough to train per category."""
    from runinfra_opt.distill.split import holdout_split
    from runinfra_opt.workload.fingerprint import prompt_digest

    history, sample = load_workload("history/mixed"), load_workload("mixed")
    assert {r.category for r in history.requests} == {r.category for r in sample.requests}
    assert not {prompt_digest(r) for r in history.requests} & {prompt_digest(r) for r in sample.requests}
    train, held = holdout_split(history.requests, 0.25)
    for category in {r.category for r in history.requests}:
        assert sum(1 for i in train if history.requests[i].category == category) >= 6, category
        assert any(history.requests[i].category == category for i in held), category
