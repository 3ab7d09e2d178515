"""bench: the losslessness rule, interleaving, aggregation, rendering, and the command through the CLI."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from runinfra_opt.bench import BenchConfig, BenchResult, make_variant, run_variants
from runinfra_opt.cli.app import app
from runinfra_opt.errors import UserInputError
from runinfra_opt.methods import BASELINE, Variant
from runinfra_opt.records import NO_PASS_SAVED, RequestRecord, compare_to_baseline
from runinfra_opt.report.bench import bench_notes, bench_table
from runinfra_opt.stats import paired, percentiles, speedup, summarize, tokens_per_s
from runinfra_opt.workload.model import Request

NGRAM = Variant("ngram", lookahead=4, ngram_max=2)


def _record(rid: str = "r", ids: list[int] | None = None, *, greedy: bool = True, **kw: Any) -> RequestRecord:
    values: dict[str, Any] = {
        "request_id": rid,
        "variant": "baseline",
        "category": "c",
        "greedy": greedy,
        "prompt_tokens": 3,
        "output_ids": ids if ids is not None else [5, 6, 7],
        "ttft_s": 0.1,
        "e2e_s": 1.0,
        "target_passes": 3,
        "draft_passes": 0,
    }
    values.update(kw)
    return RequestRecord(**values)


# ---- compare_to_baseline ----------------------------------------------------------------------------------


def test_identical_greedy_output_is_lossless() -> None:
    record = compare_to_baseline(_record(ids=[1, 2, 3]), _record(ids=[1, 2, 3]))
    assert (record.lossless, record.first_mismatch) == (True, None)


def test_first_differing_position_is_recorded() -> None:
    record = compare_to_baseline(_record(ids=[1, 2, 9, 4]), _record(ids=[1, 2, 3, 4]))
    assert (record.lossless, record.first_mismatch) == (False, 2)


def test_a_prefix_mismatches_at_the_shorter_length() -> None:
    record = compare_to_baseline(_record(ids=[1, 2]), _record(ids=[1, 2, 3]))
    assert (record.lossless, record.first_mismatch) == (False, 2)


def test_sampled_requests_are_not_compared() -> None:
    record = compare_to_baseline(_record(ids=[1], greedy=False), _record(ids=[2], greedy=False))
    assert (record.lossless, record.first_mismatch) == (None, None)


def test_comparing_different_requests_is_a_bug() -> None:
    with pytest.raises(ValueError, match="comparing request a"):
        compare_to_baseline(_record("a"), _record("b"))


# ---- run_variants (fake engine) ----------------------------------------------------------------------------


class FakeEngine:
    """Returns canned outputs; `wrong` makes a variant's output differ on one request."""

    def __init__(self, wrong: tuple[str, str] | None = None) -> None:
        self.calls: list[tuple[str, str, int]] = []
        self.warmed: list[str] = []
        self.wrong = wrong

    def warmup(self, request: Request, variant: Variant) -> None:
        self.warmed.append(variant.name)

    def generate(self, request: Request, variant: Variant, *, max_tokens: int, repeat: int = 0) -> RequestRecord:
        self.calls.append((request.id, variant.name, repeat))
        ids = [1, 2, 3, 4]
        if self.wrong == (request.id, variant.name):
            ids = [1, 2, 8, 4]
        return _record(request.id, ids, greedy=request.greedy, variant=variant.name, repeat=repeat)

    def environment(self) -> dict[str, Any]:
        return {}


REQUESTS = [Request(id="a", line=1, prompt="x"), Request(id="b", line=2, prompt="y")]


def test_variants_are_interleaved_per_request_and_repeat_after_warmup() -> None:
    engine = FakeEngine()
    records = run_variants(engine, REQUESTS, [BASELINE, NGRAM], max_tokens=8, repeat=2)
    assert engine.warmed == ["baseline", NGRAM.name]
    assert engine.calls == [
        ("a", "baseline", 0), ("a", NGRAM.name, 0), ("b", "baseline", 0), ("b", NGRAM.name, 0),
        ("a", "baseline", 1), ("a", NGRAM.name, 1), ("b", "baseline", 1), ("b", NGRAM.name, 1),
    ]  # fmt: skip
    assert [r.lossless for r in records[NGRAM.name]] == [True] * 4
    assert [r.lossless for r in records["baseline"]] == [None] * 4


def test_without_a_timed_baseline_an_untimed_reference_checks_losslessness() -> None:
    engine = FakeEngine(wrong=("b", NGRAM.name))
    sampled = Request(id="s", line=3, prompt="z", temperature=0.7)
    progress: list[tuple[int, int]] = []
    records = run_variants(
        engine, [*REQUESTS, sampled], [NGRAM], max_tokens=8, progress=lambda d, t, _: progress.append((d, t))
    )
    assert [c[:2] for c in engine.calls] == [
        ("a", "baseline"), ("a", NGRAM.name), ("b", "baseline"), ("b", NGRAM.name), ("s", NGRAM.name),
    ]  # fmt: skip
    assert list(records) == [NGRAM.name]
    assert [(r.lossless, r.first_mismatch) for r in records[NGRAM.name]] == [(True, None), (False, 2), (None, None)]
    assert progress[-1] == (5, 5)
    assert summarize(records[NGRAM.name]).lossless is False


def test_run_variants_rejects_bad_arguments() -> None:
    with pytest.raises(UserInputError, match="--repeat 0"):
        run_variants(FakeEngine(), REQUESTS, [BASELINE], max_tokens=8, repeat=0)
    with pytest.raises(UserInputError, match="no requests"):
        run_variants(FakeEngine(), [], [BASELINE], max_tokens=8)
    with pytest.raises(UserInputError, match="duplicate variants"):
        run_variants(FakeEngine(), REQUESTS, [NGRAM, NGRAM], max_tokens=8)


# ---- stats -------------------------------------------------------------------------------------------------


def test_percentiles_and_throughput_come_from_raw_values() -> None:
    assert percentiles([1.0, 2.0, 3.0, 4.0, 5.0], (50, 90)) == {"p50": 3.0, "p90": pytest.approx(4.6)}
    assert percentiles([]) == {}
    records = [_record("a", [1] * 10, e2e_s=1.0), _record("b", [1] * 30, e2e_s=3.0)]
    assert tokens_per_s(records) == pytest.approx(10.0)  # summed tokens over summed time


def test_summary_of_speculative_records() -> None:
    records = [
        _record("a", [1] * 6, ttft_s=0.2, e2e_s=1.2, accepted_per_pass=[2, 0, 1], drafted_tokens=6),
        _record("b", [1] * 4, ttft_s=0.4, e2e_s=1.0, accepted_per_pass=[1, 1], drafted_tokens=4),
    ]
    summary = summarize(records)
    assert summary.mean_accepted_per_pass == pytest.approx(5 / 5)
    assert summary.acceptance_rate == pytest.approx(5 / 10)
    assert summary.tpot_s["p50"] == pytest.approx((0.2 + 0.2) / 2)
    assert summary.output_tokens == 10
    assert summary.lossless is None


def test_speedup_pairs_by_request_and_repeat() -> None:
    base = [_record("a", [1] * 10, e2e_s=2.0), _record("b", [1] * 10, e2e_s=2.0, repeat=1)]
    fast = [_record("b", [1] * 10, e2e_s=1.0, repeat=1), _record("a", [1] * 10, e2e_s=1.0)]
    assert len(paired(fast, base)) == 2
    ratio = speedup(fast, base)
    assert ratio is not None
    assert ratio.value == pytest.approx(2.0)
    assert ratio.low == pytest.approx(2.0)
    assert speedup(fast, []) is None


# ---- make_variant and rendering ----------------------------------------------------------------------------


def test_make_variant_maps_options_to_variants() -> None:
    assert make_variant("baseline", lookahead=None) == BASELINE
    assert make_variant("ngram", lookahead=4, ngram_max=3).name == "ngram-n3-k4"
    assert make_variant("early_exit", lookahead=2, exit_layer=8).name == "early_exit-l8-k2"
    assert make_variant("draft", lookahead=6, draft="models/d1").name == "draft:d1-k6"


@pytest.mark.parametrize(
    ("method", "kw", "message"),
    [
        ("ngram", {"lookahead": None}, "--lookahead is required"),
        ("ngram", {"lookahead": 0}, "--lookahead 0"),
        ("baseline", {"lookahead": 3}, "the baseline has no lookahead"),
        ("draft", {"lookahead": 3}, "needs --draft"),
        ("ngram", {"lookahead": 3, "draft": "x"}, "--draft is only used"),
        ("early_exit", {"lookahead": 3}, "needs --exit-layer"),
        ("ngram", {"lookahead": 3, "ngram_max": 0}, "--ngram-max 0"),
        ("medusa", {"lookahead": 3}, "unknown method 'medusa'"),
    ],
)
def test_make_variant_errors(method: str, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        make_variant(method, **kw)


def _result(passes: int = 3) -> BenchResult:
    """The n-gram variant twice as fast as the baseline, its 10 tokens in `passes` target passes."""
    base = [_record("a", [1] * 10, e2e_s=2.0, ttft_s=0.5)]
    fast = [
        compare_to_baseline(
            _record(
                "a", [1] * 10, e2e_s=1.0, ttft_s=0.25, accepted_per_pass=[3, 3], drafted_tokens=8, target_passes=passes
            ),
            base[0],
        )
    ]
    records = {"baseline": base, NGRAM.name: fast}
    summaries = {name: summarize(recs) for name, recs in records.items()}
    return BenchResult(
        config=BenchConfig(variant=NGRAM, vs_baseline=True),
        variant=NGRAM.name,
        workload={"name": "w", "used_requests": 1},
        environment={},
        records=records,
        summaries=summaries,
        speedup=speedup(fast, base),
        skipped=["long"],
    )


def test_table_renders_every_figure() -> None:
    console = Console(width=100, file=io.StringIO(), color_system=None)
    console.print(bench_table(_result()))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    for label in ("TTFT p50 (ms)", "TPOT p99 (ms)", "e2e p90 (ms)", "output tokens/s", "acceptance rate"):
        assert label in text
    assert "500.0" in text  # baseline TTFT p50 in ms
    assert "250.0" in text
    assert "2.00x [2.00, 2.00]" in text
    assert "75.0%" in text  # 6 accepted of 8 drafted
    assert "yes" in text
    notes = bench_notes(_result())
    assert "skipped 1 request(s) too long for the target's context" in notes


def test_a_variant_that_saved_no_target_pass_is_noted() -> None:
    """10 tokens in 10 passes: no draft token was accepted, so the 2x measured is the machine, not the method (the
    rule `optimize` rules such a variant out by)."""
    assert not any(NO_PASS_SAVED in note for note in bench_notes(_result(passes=9)))
    assert f"{NGRAM.name}: {NO_PASS_SAVED}" in bench_notes(_result(passes=10))


def test_json_dict_has_summaries_and_records() -> None:
    data = json.loads(json.dumps(_result().to_dict()))
    assert data["lossless"] is True
    assert data["speedup"]["value"] == pytest.approx(2.0)
    assert data["summaries"][NGRAM.name]["tokens_per_s"] == pytest.approx(10.0)
    assert data["records"][NGRAM.name][0]["output_tokens"] == 10
    assert data["config"]["variant_name"] == NGRAM.name


# ---- the command on tiny models ----------------------------------------------------------------------------


@pytest.fixture
def workload_file(tmp_path: Path) -> Path:
    lines = [
        {"id": "w1", "category": "copy", "prompt": "the cat sat on the mat. the cat sat on the mat. the cat"},
        {"id": "w2", "category": "chat", "messages": [{"role": "user", "content": "say abc abc abc"}]},
        {"id": "w3", "category": "copy", "prompt": "one two one two one two", "max_tokens": 6},
    ]
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


def test_bench_cli_json_vs_baseline(runner: CliRunner, tiny_models: tuple[Path, Path], workload_file: Path) -> None:
    target, draft = tiny_models
    args = ["bench", "--workload", str(workload_file), "--target", str(target), "--draft", str(draft)]
    args += ["--method", "draft", "--lookahead", "3", "--vs-baseline", "--json", "--max-tokens", "24"]
    args += ["--repeat", "2", "--threads", "1", "--device", "cpu"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["variant"] == "draft:tiny-draft-k3"
    assert data["lossless"] is True
    assert data["speedup"]["value"] > 0
    assert set(data["summaries"]) == {"baseline", "draft:tiny-draft-k3"}
    assert len(data["records"]["baseline"]) == 6  # 3 requests x 2 repeats
    assert data["environment"]["threads"] == 1
    w3 = [r for r in data["records"]["baseline"] if r["request_id"] == "w3"]
    assert all(r["output_tokens"] <= 6 for r in w3)  # the request's own max_tokens
    assert data["notes"][0] == "3 request(s) x 2 repeat(s), max 24 new tokens"  # the lines under the table


def test_bench_cli_table(runner: CliRunner, tiny_models: tuple[Path, Path], workload_file: Path) -> None:
    args = ["bench", "--workload", str(workload_file), "--target", str(tiny_models[0]), "--device", "cpu"]
    args += ["--method", "early_exit", "--exit-layer", "2", "--lookahead", "2", "--requests", "2"]
    args += ["--max-tokens", "16"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "early_exit-l2-k2" in result.stdout
    assert "accepted per target pass" in result.stdout
    assert "2 request(s) x 1 repeat(s)" in result.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--method", "ngram"], "--lookahead is required for --method ngram"),
        (["--method", "nope", "--lookahead", "2"], "unknown method 'nope'"),
        (["--method", "ngram", "--lookahead", "2", "--requests", "0"], "--requests 0"),
        (["--method", "early_exit", "--lookahead", "2", "--exit-layer", "9"], "exit layer 9 must be below"),
        (["--method", "baseline", "--device", "tpu"], "--device tpu"),
    ],
)
def test_bench_cli_bad_usage_exits_2(
    runner: CliRunner, tiny_models: tuple[Path, Path], workload_file: Path, extra: list[str], message: str
) -> None:
    args = ["bench", "--workload", str(workload_file), "--target", str(tiny_models[0]), "--max-tokens", "4", *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_bench_cli_missing_workload_and_model(runner: CliRunner, tmp_path: Path, workload_file: Path) -> None:
    result = runner.invoke(app, ["bench", "--workload", str(tmp_path / "nope.jsonl"), "--method", "baseline"])
    assert result.exit_code == 2, result.output
    result = runner.invoke(
        app, ["bench", "--workload", str(workload_file), "--target", str(tmp_path / "nomodel"), "--method", "baseline"]
    )
    assert result.exit_code == 2, result.output
    assert "nomodel" in result.stderr


def test_bench_cli_too_long(runner: CliRunner, tiny_models: tuple[Path, Path], tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    rows = [{"id": "ok", "prompt": "hi"}, {"id": "huge", "prompt": "x" * 4090}]
    path.write_text("".join(json.dumps(x) + "\n" for x in rows), encoding="utf-8")
    args = ["bench", "--workload", str(path), "--target", str(tiny_models[0]), "--method", "baseline"]
    args += ["--max-tokens", "16"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"{path}:2: request huge: prompt (4090 tokens) + max_tokens (16) exceeds" in result.stderr
    result = runner.invoke(app, [*args, "--skip-too-long", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["skipped"] == ["huge"]
    assert data["workload"]["used_requests"] == 1
