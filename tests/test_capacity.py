"""`--priority capacity`: the requests/s one server sustains within the SLOs, searched on the stand-in server
(tests/fake_vllm) and predicted by the serving predictor; the decision by servers needed; the option checks."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from runinfra_opt.cli.app import app
from runinfra_opt.engine.vllm.metrics import parse_counters
from runinfra_opt.load import LevelRun, LoadRecord, Rate, Replay
from runinfra_opt.load.capacity import (
    MAX_LEVELS,
    TOLERANCE,
    RateSearch,
    attainment_interval,
    ceiling,
    peak_rate,
    pooled,
    queue_grew,
    ramp,
    rate_text,
    servers_needed,
    share_text,
    unclear,
    verdict,
)
from runinfra_opt.load.store import read_run
from runinfra_opt.manifest import build_manifest, check_manifest_file, write_manifest
from runinfra_opt.report import capacity as capacity_report
from runinfra_opt.results import CapacityLevel, CapacityRow, CapacitySummary, RunResults, load_results
from tests.test_manifest import NGRAM, _results
from tests.test_optimize_vllm_predict import COST, PROMPTS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--priority", "capacity", "--slo-ttft-ms", "500"], "--priority capacity: the transformers engine runs one"),
        (["--priority", "capacity", "--engine", "vllm"], "--priority capacity needs a service level: --slo-ttft-ms"),
        (["--target-rate", "3"], "--target-rate needs --priority capacity"),
        (
            ["--priority", "capacity", "--engine", "vllm", "--slo-tpot-ms", "50", "--slo-attainment", "0"],
            "--slo-attainment 0: must be a share in (0, 1]",
        ),
        (
            ["--priority", "capacity", "--engine", "vllm", "--slo-tpot-ms", "50", "--server-cost-per-hour", "-1"],
            "--server-cost-per-hour -1: must be > 0",
        ),
        (
            ["--priority", "capacity", "--engine", "vllm", "--slo-tpot-ms", "50", "--capacity-requests", "0"],
            "--capacity-requests 0: must be at least 1",
        ),
    ],
)
def test_capacity_options_exit_2_with_one_line(runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["optimize", *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert message in lines[0], result.output


# ---- on the stand-in server's table engine (steps priced as tests/test_optimize_vllm_predict.py prices them;
# its outputs cycle their prompts, so n-gram drafts are mostly accepted: fewer steps per request) ---------------


SCALE = 0.5
"""The stand-in's step costs (tests/test_optimize_vllm_predict.py's `COST`), the SLOs and the recorded gaps, all
times this: the same knees in steps and requests, reached in half the wall time (the tests mostly wait)."""
FAST = {name: value if name == "bulk_after" else value * SCALE for name, value in COST.items()}


def _rows(arrivals: bool = False, count: int = 12) -> str:
    rows = [
        {"id": f"r{i}", "category": "copy", "prompt": f"request {i}: {PROMPTS[i % len(PROMPTS)]}"} for i in range(count)
    ]
    for i, row in enumerate(rows):
        row.update({"arrival_s": i / 2 * SCALE} if arrivals else {})  # 2 requests/s unscaled: the stand-in keeps up
    return "".join(json.dumps(row) + "\n" for row in rows)


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "w.jsonl"
    path.write_text(_rows())
    return path


def _optimize(
    runner: CliRunner, python: str, target: Path, workload: Path, tmp_path: Path, *extra: str, code: int = 0
) -> tuple[Any, RunResults]:
    args = ["optimize", "--engine", "vllm", "--vllm-python", python, "--target", str(target)]
    args += ["--workload", str(workload), "--methods", "vllm_ngram", "--ngram-max", "3", "--max-tokens", "16"]
    args += ["--repeats", "1", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "m.yaml"), *extra]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result, load_results(tmp_path / "run" / "results.json")


@pytest.fixture
def table_server(fake_vllm: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("FAKE_VLLM_STEP", "table")
    monkeypatch.setenv("FAKE_VLLM_STEP_COST", json.dumps(FAST))
    return fake_vllm


SLO = ("--slo-ttft-ms", f"{1000 * SCALE:g}", "--slo-tpot-ms", f"{60 * SCALE:g}", "--slo-attainment", "0.9")
"""11 of the 12 requests within TTFT 1 s and TPOT 60 ms (x `SCALE`): the stand-in's baseline steps take 20 ms + 7 ms
a sequence (x `SCALE`; its TPOT p95 is ~50 ms alone), so it misses the TPOT from a few in flight; n-gram drafts, mostly
accepted, emit several tokens a step, so an n-gram variant carries more."""


@pytest.mark.quiet
def test_capacity_decides_by_servers_needed(
    runner: CliRunner, table_server: str, tiny_models: tuple[Path, Path], workload: Path, tmp_path: Path
) -> None:
    result, results = _optimize(
        runner, table_server, tiny_models[0], workload, tmp_path,
        "--priority", "capacity", *SLO, "--load", "none", "--target-rate", "1000", "--server-cost-per-hour", "2",
        "--confirm", "1", "--capacity-requests", "14",
    )  # fmt: skip
    out = " ".join(result.output.split())
    assert "capacity search: a warm-up, then up to 6 offered rates (and 2 runs more" in out  # the plan, up front
    assert "(14 requests, poisson arrivals)" in out
    summary = results.capacity
    assert summary is not None
    assert (summary.why, summary.criterion, summary.target_rate) == ("--priority capacity", "slo", 1000.0)
    assert summary.requests_per_level == 14  # the 12 planned, then the first 2 again
    # open-loop rates hold many sequences a step: the step costs are measured past batch 1 despite `--load none`
    costs = results.cost_model.serving
    assert costs is not None
    assert max(costs.step_costs.table.batch_sizes) > 1
    rows = {row.variant: row for row in summary.rows}
    assert set(rows) == {v.name for v in results.variants}
    for vr in results.variants:
        vc = vr.capacity
        assert vc is not None
        assert vc.predicted is not None, vr.name  # every variant predicted
        if not vr.confirmed:
            assert rows[vr.name].source == "predicted"
            continue
        assert vc.measured is not None, vr.name  # every launched one searched
        assert vc.search_start is not None
        assert vc.before_warmup is not None  # predicted before its warm-up, and again after it (the search's start)
        assert vc.warmup_s is not None  # warmed up, untimed
        assert vc.warmup_s > 0
        rates = [level.rate for level in vc.levels]
        assert 1 <= len(set(rates)) <= 6
        purposes = [level.purpose for level in vc.levels]
        assert purposes.count("unclear") <= 2  # runs added to unclear rates, two a server at most
        for i, level in enumerate(vc.levels):
            if level.purpose == "unclear":  # right after a first run whose verdict was unclear
                assert vc.levels[i - 1].rate == level.rate
                assert unclear([vc.levels[i - 1]], 0.9), vc.levels[i - 1]
            if level.purpose == "confirm":  # a rate the search found sustained, run again
                assert [run.purpose for run in vc.levels[:i] if run.rate == level.rate] == ["search"]
        if vc.measured.value > 0:  # the capacity reported was sustained on two runs at least
            assert rates.count(vc.measured.value) >= 2, vc.levels
        assert vc.levels[0].rate == pytest.approx(vc.search_start, rel=0.01)  # it starts at the prediction
        for level in vc.levels:
            assert level.passed == (not level.reason)
            assert level.attained is not None
            assert level.requests == 14
            assert level.records is not None
            sent = [r.request_id for r in read_run(tmp_path / "run" / level.records).records]
            assert sorted(sent) == sorted([f"r{i}" for i in range(12)] + ["r0+1", "r1+1"])
        row = rows[vr.name]
        assert row.source == "measured"
        # a target above every capacity: server counts, not an error
        assert row.servers == math.ceil(1000 / row.capacity), vr.name
        assert row.cost_per_hour == pytest.approx(2 * row.servers)
        assert row.cost_per_million_tokens is not None
    # the predictions price their steps by batch size as the baseline's warm-up showed them
    warmup = results.variant("baseline").capacity.warmup_records  # type: ignore[union-attr]
    assert warmup is not None
    warm = read_run(tmp_path / "run" / warmup).records  # kept, judged by nothing
    assert sorted(r.request_id for r in warm) == sorted([f"r{i}" for i in range(12)] + ["r0+1", "r1+1"])
    # its rate rose through the run: the planned sends are the ramp's, whatever the batch-1 length that scaled them
    # (when each was actually sent moves with the load on a 2-core machine: the runner's send lag is tested apart)
    planned = sorted(r.planned_s - min(r.planned_s for r in warm) for r in warm)
    shape = ramp(14, 1.0)
    assert [at / planned[-1] for at in planned] == pytest.approx([at / shape[-1] for at in shape], abs=1e-3)
    gaps = [b - a for a, b in zip(planned, planned[1:], strict=False)]
    assert gaps[0] > 4 * gaps[-1]  # from one request in flight to the ceiling
    fitted = costs.capacity_corrections
    assert fitted is not None
    assert fitted.fitted_to.startswith(f"the baseline's warm-up for its capacity search ({warmup})")
    batches = [b for b, _ in fitted.by_batch]
    assert batches == sorted(batches)
    assert max(batches) > 1  # the warm-up stepped many sequences at once
    assert results.decision is not None
    assert results.decision.winner == summary.winner
    assert results.decision.reason.startswith(
        f"By capacity (--priority capacity; 90% of requests within TTFT <= {1000 * SCALE:g} ms and TPOT <= "
        f"{60 * SCALE:g} ms)"
    )
    winner = rows[summary.winner]
    base = rows["baseline"]
    if summary.winner != "baseline":  # a speculative winner sustained a rate the baseline missed
        assert winner.low is not None
        assert base.high is not None
        assert winner.low > base.high
    manifest = yaml.safe_load((tmp_path / "m.yaml").read_text())
    assert manifest["capacity"]["servers"] == winner.servers
    assert "Capacity per server" in out
    report = runner.invoke(app, ["report", str(tmp_path / "run"), "--format", "markdown"])
    assert "### Capacity per server" in report.stdout
    page = runner.invoke(app, ["report", str(tmp_path / "run"), "--format", "html"])
    assert 'id="plot-capacity-ttft"' in page.stdout
    assert 'id="plot-capacity-tpot"' in page.stdout


@pytest.mark.quiet
def test_a_variant_whose_output_differs_does_not_win_on_capacity(
    runner: CliRunner,
    table_server: str,
    tiny_models: tuple[Path, Path],
    workload: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAKE_VLLM_SPEC", "diverge:6")  # output token 6 differs, with a 2-nat margin: confident
    _, results = _optimize(
        runner, table_server, tiny_models[0], workload, tmp_path,
        "--priority", "capacity", *SLO, "--load", "none", "--confirm", "1", "--budget-minutes", "0.01",
        "--capacity-requests", "12",
    )  # fmt: skip
    summary = results.capacity
    assert summary is not None
    launched = [vr for vr in results.variants if vr.name != "baseline" and vr.confirmed]
    assert launched
    assert all(vr.disqualified is not None for vr in launched)
    speculative = max(launched, key=lambda vr: vr.capacity.predicted or 0 if vr.capacity else 0)
    assert speculative.capacity is not None
    baseline = results.variant("baseline")
    assert baseline is not None
    assert baseline.capacity is not None
    assert baseline.capacity.measured is not None
    assert speculative.capacity.predicted is not None
    assert speculative.capacity.predicted > baseline.capacity.measured.value  # predicted to carry more traffic
    assert "not searched: its greedy output differs" in (speculative.capacity.note or "")
    row = next(row for row in summary.rows if row.variant == speculative.name)
    assert not row.eligible
    assert "differs" in (row.why_not or "")
    assert summary.winner == "baseline"
    assert results.decision is not None
    assert results.decision.winner == "baseline"
    assert summary.target_rate is None  # no recorded arrivals, no --target-rate: no server count
    # a budget spent before the search: the least a search measures (a warm-up and one rate), and it says so
    assert len(baseline.capacity.levels) == 1
    assert summary.budget_ran_out[0].startswith(
        "baseline: --budget-minutes left 0 s for its search; its warm-up and one offered rate"
    ), summary.budget_ran_out
    assert summary.budget_ran_out[-1].startswith("baseline: the budget allowed 1 rate(s); the answer is [")
    assert all(row.servers is None for row in summary.rows)


# ---- the search rules, on their own ----------------------------------------------------------------------------


def _search(start: float, knee: float, **kwargs: Any) -> tuple[list[float], Any]:
    """Run a `RateSearch` against a server that sustains every rate up to `knee`."""
    rules = RateSearch(start, **kwargs)
    tried: list[tuple[float, bool]] = []
    while (rate := rules.next_rate(tried)) is not None:
        tried.append((rate, rate <= knee))
    return [rate for rate, _ in tried], rules.estimate(tried)


@pytest.mark.parametrize(("start", "knee"), [(4.0, 4.3), (4.0, 3.1), (2.0, 3.9), (6.0, 3.9)])
def test_rate_search_brackets_the_knee_within_the_tolerance(start: float, knee: float) -> None:
    rates, estimate = _search(start, knee)
    assert rates[0] == start
    assert len(rates) <= MAX_LEVELS
    assert estimate.status == "bracketed"
    assert estimate.low <= knee < estimate.high
    assert estimate.high / estimate.low - 1 <= TOLERANCE


def test_a_capacity_missed_when_run_again_reopens_the_search_below_it() -> None:
    search = RateSearch(1.82, floor=0.1, ceiling=12.0)
    # the start sustained, the rates above it missed; then the start, run again, missed on both runs pooled
    tried = [(1.82, False), (2.27, False), (2.03, False), (1.92, False)]
    assert search.next_rate(tried) == pytest.approx(1.82 / 1.25)  # one step below it, not four
    assert search.next_rate([*tried, (1.456, False)]) == pytest.approx(1.456 / 1.25**2)
    assert search.next_rate([*tried, (1.456, True)]) == pytest.approx(math.sqrt(1.456 * 1.82))


def test_rate_search_is_bounded_and_says_when_it_is_not_bracketed() -> None:
    rates, estimate = _search(4.0, 0.05)  # a prediction 80x too high: the levels run out first
    assert len(rates) == MAX_LEVELS
    assert (estimate.status, estimate.value, estimate.low) == ("below", 0.0, 0.0)
    rates, estimate = _search(4.0, 100.0, ceiling=6.0)  # never missed: capacity at least the highest measurable
    assert rates[-1] == 6.0
    assert max(rates) == 6.0
    assert (estimate.status, estimate.value) == ("at_least", 6.0)


@pytest.mark.parametrize(("asked", "planned", "sent"), [(None, 9, 48), (None, 60, 60), (14, 12, 14), (5, 12, 12)])
def test_each_rate_sends_48_requests_unless_told(asked: int | None, planned: int, sent: int) -> None:
    from types import SimpleNamespace

    from runinfra_opt.optimize.capacity import level_requests
    from runinfra_opt.workload.model import Request

    requests = [Request(id=f"r{i}", line=i + 1, prompt="hi", max_tokens=4) for i in range(planned)]
    state = SimpleNamespace(requests=requests, config=SimpleNamespace(capacity_requests=asked))
    sent_requests = level_requests(state)  # type: ignore[arg-type]
    assert len(sent_requests) == sent
    assert [r.id for r in sent_requests[:planned]] == [r.id for r in requests[:sent]]  # the planned ones first


@pytest.mark.parametrize("requests", [48, 14, 200])
def test_a_warm_up_ramps_its_rate_from_one_request_in_flight_to_the_ceiling(requests: int) -> None:
    e2e = 1.3
    times = ramp(requests, e2e)
    assert len(times) == requests
    assert times[0] == 0.0
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(later < earlier for earlier, later in zip(gaps, gaps[1:], strict=False))  # the rate only rises
    assert 1 / gaps[0] == pytest.approx((1 / e2e) * (ceiling(requests, e2e) * e2e) ** (1 / (requests - 1)))
    assert 1 / gaps[-1] == pytest.approx(ceiling(requests, e2e))  # up to the highest measurable rate
    # as many requests arrive per doubling of the rate below the ceiling: the first and second halves of the
    # requests span the same factor of rate
    rates = [1 / g for g in gaps]
    middle = len(rates) // 2
    assert rates[middle] / rates[0] == pytest.approx(rates[-1] / rates[middle], rel=0.1)
    assert ramp(3, e2e) == pytest.approx([0.0, 1 / ceiling(3, e2e), 2 / ceiling(3, e2e)])  # ceiling below the start


def test_peak_rate_and_servers_needed() -> None:
    assert peak_rate([0.0, 1.0, 2.0, 4.0]) == pytest.approx(0.75)  # shorter than the window: the mean rate
    burst = [float(i) for i in range(100)] + [100 + i / 10 for i in range(60)]  # 1/s, then 10/s for 6 s
    assert peak_rate(burst, window_s=10.0) == pytest.approx(6.4)
    assert peak_rate([1.0]) is None
    assert servers_needed(10.0, 4.0) == 3
    assert servers_needed(8.0, 4.0) == 2
    assert servers_needed(0.5, 4.0) == 1
    assert servers_needed(1.0, 0.0) is None


def test_rates_read_as_people_write_them() -> None:
    """Three significant digits, never an exponent: a recorded peak of 13 arrivals a minute is not 0.216667."""
    rates = (13 / 60, 1.87, 42.54, 99.4, 1000.0, 1249.6)
    assert [rate_text(rate) for rate in rates] == ["0.217", "1.87", "42.5", "99.4", "1,000", "1,250"]
    summary = CapacitySummary(
        criterion="slo", why="--priority capacity", slo_ttft_ms=800, target_rate=13 / 60, target_source="recorded"
    )
    assert "; target 0.217 requests/s (recorded)." in capacity_report.intro(summary)


def _record(index: int, sent: float, ttft: float, e2e: float = 1.0, tokens: int = 11) -> LoadRecord:
    return LoadRecord(
        index=index, request_id=f"r{index}", category="c", planned_s=sent, sent_s=sent, done_s=sent + e2e,
        success=True, ttft_s=ttft, e2e_s=e2e, output_tokens=tokens,
    )  # fmt: skip


def test_verdict_names_a_growing_queue_and_the_attainment() -> None:
    steady = [_record(i, i * 0.5, 0.1) for i in range(12)]
    run = LevelRun(Rate(2.0), steady, 0.0, 7.0, 2)
    level = verdict(run, 2.0, slo_ttft_ms=200, slo_tpot_ms=100, attainment=0.99)
    assert (level.passed, level.kept_up, level.attained, level.reason) == (True, True, 1.0, "")
    growing = [_record(i, i * 0.5, 0.1 + 0.2 * i) for i in range(12)]
    run = LevelRun(Rate(2.0), growing, 0.0, 9.0, 6)
    level = verdict(run, 2.0, slo_ttft_ms=None, slo_tpot_ms=None, attainment=0.99)
    assert not level.passed
    assert not level.kept_up
    assert "the queue grew through the run" in level.reason
    # overloaded: every request is stretched to 20 s, the waits grow from 2 s to 8 s; growth is measured against a
    # request's length alone (batch 1), not against the stretched one
    stretched = [_record(i, i * 0.2, 2.0 + 0.5 * i, e2e=20.0) for i in range(12)]
    run = LevelRun(Rate(5.0), stretched, 0.0, 25.0, 12)
    assert verdict(run, 5.0, slo_ttft_ms=None, slo_tpot_ms=None, attainment=0.99).kept_up
    level = verdict(run, 5.0, slo_ttft_ms=None, slo_tpot_ms=None, attainment=0.99, request_s=2.8)
    assert not level.kept_up
    assert "the queue grew through the run" in level.reason
    level = verdict(LevelRun(Rate(2.0), steady, 0.0, 7.0, 2), 2.0, slo_ttft_ms=None, slo_tpot_ms=None,
                    attainment=0.99, preemptions=3, kv_cache_peak=0.97)  # fmt: skip
    assert "the server preempted 3 time(s), KV cache up to 97%" in level.reason
    slow_tpot = [_record(i, i * 0.5, 0.1, e2e=2.1) for i in range(12)]  # TPOT 200 ms
    level = verdict(LevelRun(Rate(2.0), slow_tpot, 0.0, 8.0, 5), 2.0, slo_ttft_ms=None, slo_tpot_ms=150,
                    attainment=0.99)  # fmt: skip
    assert (level.passed, level.attained) == (False, 0.0)
    assert "0 of 12 requests (0%) within the SLOs, below 99%" in level.reason
    # a share that rounds to the one asked for is printed with the decimals that tell them apart
    one_slow = [*[_record(i, i * 0.5, 0.1, e2e=1.0) for i in range(47)], _record(47, 23.5, 0.1, e2e=2.1)]
    level = verdict(LevelRun(Rate(2.0), one_slow, 0.0, 30.0, 5), 2.0, slo_ttft_ms=None, slo_tpot_ms=150,
                    attainment=0.98)  # fmt: skip
    assert "47 of 48 requests (97.9%) within the SLOs, below 98%" in level.reason
    assert [share_text(a, b) for a, b in [(0.896, 0.9), (0.8996, 0.9), (0.5, 0.9), (0.9, 0.9)]] == [
        "89.6%", "89.96%", "50%", "90%"
    ]  # fmt: skip


def test_a_recorded_pattern_grows_its_queue_only_round_over_round() -> None:
    """A recording's thirds differ by design (summarize's last third holds its densest bursts): under a recorded
    pattern the queue grew only when the same recorded requests waited longer in the sample's last round."""
    burst = [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 4.0, 6.0, 8.0, 10.0]  # TTFT (s) as the pattern's bursts make them

    def rounds(*ttfts: list[float]) -> list[LoadRecord]:
        out = []
        for k, round_ttft in enumerate(ttfts):
            for i, ttft in enumerate(round_ttft):
                record = _record(len(out), 30.0 * k + i, ttft, e2e=ttft + 1.0)
                out.append(dataclasses.replace(record, request_id=f"r{i}" + (f"+{k}" if k else "")))
        return out

    one = rounds(burst)
    grew = verdict(LevelRun(Rate(1.0), one, 0.0, 30.0, 4), 1.0, slo_ttft_ms=None, slo_tpot_ms=None, attainment=0.9,
                   request_s=1.0)  # fmt: skip
    assert "the queue grew through the run (TTFT median 500 ms over the first third of sends" in grew.reason
    level = verdict(LevelRun(Replay(), one, 0.0, 30.0, 4), 1.0, slo_ttft_ms=None, slo_tpot_ms=None, attainment=0.9,
                    request_s=1.0)  # fmt: skip
    assert level.kept_up  # one round: nothing like to compare
    assert queue_grew(rounds(burst, burst), 1.0, recorded=True) == (
        False, "TTFT median 500 ms over the recorded sample's first round, 500 ms over the same requests in round 2"
    )  # fmt: skip
    later = [t + 3.0 for t in burst[:6]]  # a partial last round: its requests against the same ones in the first
    grew_text = "TTFT median 500 ms over the recorded sample's first round, 3500 ms over the same requests in round 3"
    assert queue_grew(rounds(burst, burst, later), 1.0, recorded=True) == (True, grew_text)
    level = verdict(LevelRun(Replay(), rounds(burst, burst, later), 0.0, 90.0, 6), 1.0, slo_ttft_ms=None,
                    slo_tpot_ms=None, attainment=0.9, request_s=1.0)  # fmt: skip
    assert level.reason == f"the queue grew through the run ({grew_text})"
    # an id of the sample's own that ends in +<n> is a recorded request, not a copy, when no `<id>` was sent
    odd = [dataclasses.replace(r, request_id=f"q+{r.index}") for r in rounds(burst)]
    assert queue_grew(odd, 1.0, recorded=True) == (False, "")


def _level(rate: float, met: int, requests: int = 36, kept_up: bool = True) -> CapacityLevel:
    share = met / requests
    return CapacityLevel(rate=rate, requests=requests, attained=share, kept_up=kept_up, passed=kept_up and share >= 0.9)


def test_an_unclear_verdict_is_run_again_and_judged_pooled() -> None:
    low, high = attainment_interval(33, 36)
    assert low < 0.9 < high  # 33 of 36 against 90%: one run cannot say
    assert unclear([_level(1.0, 33)], 0.9)
    assert unclear([_level(1.0, 32)], 0.9)
    assert not unclear([_level(1.0, 36)], 0.9)  # every request within the SLOs: as clear as 36 requests show
    assert not unclear([_level(1.0, 20)], 0.9)  # far below
    assert not unclear([_level(1.0, 33, kept_up=False)], 0.9)  # a growing queue is clear
    assert not unclear([CapacityLevel(rate=1.0, requests=36, passed=True)], 0.9)  # no SLO: keeping up only
    # Judged on every run of a rate pooled, in the order the rates were first offered: 33 + 28 of 72 misses 90%,
    # 34 + 36 of 72 attains it, and a run that fell behind misses the rate whatever the share.
    levels = [_level(1.2, 33), _level(0.8, 34), _level(1.2, 28), _level(0.8, 36), _level(1.0, 36),
              _level(1.0, 35, kept_up=False)]  # fmt: skip
    assert pooled(levels, 0.9) == [(1.2, False), (0.8, True), (1.0, False)]
    assert pooled([_level(1.2, 33)], 0.9) == [(1.2, True)]
    assert pooled([CapacityLevel(rate=2.0, requests=12, passed=True)], 0.9) == [(2.0, True)]


# ---- the manifest's capacity section and its Helm values -------------------------------------------------------


def _capacity_manifest(tmp_path: Path, *, servers: int | None) -> tuple[Path, dict[str, Any]]:
    results = _results(NGRAM)
    assert results.decision is not None
    rows = [
        CapacityRow(variant="baseline", capacity=1.2, low=1.2, high=1.4, source="measured", servers=servers and 9),
        CapacityRow(variant=NGRAM.name, capacity=1.8, low=1.8, high=1.95, source="measured", servers=servers),
    ]
    results.capacity = CapacitySummary(
        criterion="slo", why="--priority capacity", slo_ttft_ms=800, slo_tpot_ms=100, rows=rows, winner=NGRAM.name,
        target_rate=10.0 if servers else None, target_source="--target-rate", reason="By capacity",
    )  # fmt: skip
    manifest = build_manifest(results)
    path = tmp_path / "m.yaml"
    write_manifest(path, manifest)
    return path, manifest


def test_manifest_capacity_section_is_valid_and_names_the_servers(tmp_path: Path) -> None:
    path, manifest = _capacity_manifest(tmp_path, servers=6)
    capacity = manifest["capacity"]
    assert capacity["servers"] == 6
    assert capacity["perServer"] == {
        "variant": NGRAM.name, "requestsPerS": 1.8, "low": 1.8, "high": 1.95, "source": "measured", "servers": 6,
    }  # fmt: skip
    assert capacity["slo"] == {"ttftMs": 800, "tpotMs": 100, "attainment": 0.99}
    assert [row["variant"] for row in capacity["variants"]] == ["baseline", NGRAM.name]
    assert not check_manifest_file(path)


def test_helm_values_carry_the_winners_arguments_and_the_servers(tmp_path: Path, runner: CliRunner) -> None:
    path, manifest = _capacity_manifest(tmp_path, servers=6)
    result = runner.invoke(app, ["manifest", "export", "--format", "helm-values", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# vLLM production-stack Helm values exported by runinfra-opt")
    values = yaml.safe_load(result.stdout)
    (spec,) = values["servingEngineSpec"]["modelSpec"]
    args = manifest["serving"]["vllm"]["args"]
    assert spec["modelURL"] == args[args.index("--model") + 1]
    assert spec["replicaCount"] == 6
    config = spec["vllmConfig"]
    assert config["maxModelLen"] == int(args[args.index("--max-model-len") + 1])
    assert config["dtype"] == args[args.index("--dtype") + 1]
    extra = config["extraArgs"]
    spec_json = args[args.index("--speculative-config") + 1]
    assert extra[extra.index("--speculative-config") + 1] == spec_json
    assert json.loads(spec_json)["num_speculative_tokens"] == NGRAM.lookahead
    rebuilt = ["--model", spec["modelURL"], "--dtype", config["dtype"], "--max-model-len", str(config["maxModelLen"])]
    assert sorted(rebuilt + extra) == sorted(args), "every argument, once"
    result = runner.invoke(app, ["manifest", "export", "--format", "helm-values", "--json", str(path)])
    assert json.loads(result.stdout)["values"] == values
    # without a capacity decision with a target: one replica, and the header says why
    path, _ = _capacity_manifest(tmp_path / "none", servers=None)
    result = runner.invoke(app, ["manifest", "export", "--format", "helm-values", str(path)])
    assert yaml.safe_load(result.stdout)["servingEngineSpec"]["modelSpec"][0]["replicaCount"] == 1
    assert "replicaCount 1: the run made no capacity decision with a target rate" in result.stdout


def test_preemptions_and_kv_cache_usage_are_read_from_metrics() -> None:
    before = parse_counters('# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total{engine="0"} 2.0\n')
    text = (
        "# TYPE vllm:num_preemptions counter\n"
        'vllm:num_preemptions_total{engine="0"} 5.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0"} 0.83\n'
    )
    after = parse_counters(text)
    assert (after.preemptions, after.kv_cache_usage) == (5.0, 0.83)
    assert after.minus(before).preemptions == 3.0
    assert parse_counters("").kv_cache_usage is None


def test_a_capacity_seen_only_as_a_lower_bound_ranks_nothing() -> None:
    """A server that kept up at every rate tried has a capacity of at least that: two such bounds, or one beside a
    bracket it does not clear, cannot say which variant carries more (a real-vLLM run with the default budget
    tried one rate per server and kept the baseline on 0.815 >= vs 0.609 >=)."""
    from types import SimpleNamespace

    from runinfra_opt.optimize.decision.capacity import _unresolved
    from runinfra_opt.results import CapacityLevel, CapacityRow, Interval, VariantCapacity

    runs: dict[str, VariantCapacity] = {}

    def row(name: str, *tried: tuple[float, bool]) -> CapacityRow:
        sustained = max(rate for rate, passed in tried if passed)
        missed = [rate for rate, passed in tried if not passed and rate > sustained]
        high = min(missed) if missed else sustained
        runs[name] = VariantCapacity(
            measured=Interval(value=sustained, low=sustained, high=high),
            levels=[CapacityLevel(rate=rate, requests=12, passed=passed) for rate, passed in tried],
        )
        return CapacityRow(variant=name, capacity=sustained, low=sustained, high=high, source="measured")

    results: Any = SimpleNamespace(variant=lambda name: SimpleNamespace(capacity=runs[name]), capacity=None)
    base, spec = row("baseline", (0.815, True)), row("ngram", (0.609, True))
    assert _unresolved(results, base, [spec]) == ["ngram kept up at every rate tried (at least 0.609 requests/s)"]
    spec = row("ngram", (0.5, True), (0.55, False))  # bracketed below the baseline's bound: it carries less
    assert _unresolved(results, base, [spec]) == []
    spec = row("ngram", (0.9, True), (1.0, False))  # above the baseline's bound, whose own knee is unknown
    assert _unresolved(results, base, [spec]) == [
        "the baseline kept up at every rate tried (at least 0.815 requests/s), and ngram's capacity "
        "(0.9 requests/s [0.9, 1]) is not below that"
    ]
    base = row("baseline", (0.815, True), (0.9, False))  # both bracketed: the usual rule decides
    assert _unresolved(results, base, [spec]) == []


def test_a_variant_that_saved_no_target_pass_is_not_searched_and_wins_no_capacity() -> None:
    """Nothing it drafted at batch 1 was accepted: minutes of offered rates could only measure noise."""
    from types import SimpleNamespace

    from runinfra_opt.methods import Variant
    from runinfra_opt.optimize import capacity as capacity_phase
    from runinfra_opt.optimize.decision.capacity import _rows
    from runinfra_opt.records import NO_PASS_SAVED, RequestRecord
    from runinfra_opt.results import Interval, VariantCapacity, VariantResult

    def result(variant: Variant, passes: int) -> VariantResult:
        records = [
            RequestRecord(request_id=f"r{i}", category="c", prompt_tokens=5, output_tokens=8, ttft_s=0.1, e2e_s=0.5,
                          target_passes=passes, lossless=True)
            for i in range(3)
        ]  # fmt: skip
        return VariantResult(name=variant.name, variant=variant.to_dict(), measured_requests=records, confirmed=True)

    ngram = Variant("vllm_ngram", lookahead=2, ngram_max=3)
    summary = CapacitySummary(criterion="slo", why="--priority capacity")
    vr = result(ngram, 8)  # 8 tokens in 8 passes
    state: Any = SimpleNamespace(results=SimpleNamespace(capacity=summary), variant_result=lambda _: vr,
                                 save=lambda: None)  # fmt: skip
    capacity_phase.search(state, ngram)  # returns before it needs a server, a budget or a workload
    assert vr.capacity is not None
    assert vr.capacity.note == "not searched: no target pass at batch 1 produced more than one token (it cannot win)"
    assert vr.capacity.levels == []
    # a capacity measured for it anyway (a run from before the rule) is shown, never eligible
    base, ghost = result(Variant("baseline"), 8), result(ngram, 8)
    for vr, rate in ((base, 1.0), (ghost, 1.5)):
        vr.capacity = VariantCapacity(measured=Interval(value=rate, low=rate, high=rate * 1.1))
    results = RunResults(run_id="t", created_at="2026-01-01T00:00:00Z", variants=[base, ghost])
    rows = {row.variant: row for row in _rows(results, summary)}
    assert rows["baseline"].eligible
    assert (rows[ghost.name].eligible, rows[ghost.name].why_not) == (False, NO_PASS_SAVED)


def test_an_undecided_capacity_falls_back_to_the_most_loaded_level_else_batch_1() -> None:
    """At a recorded load that does not saturate the server, where capacity decides nothing either: throughput at
    the most loaded closed-loop level (by its concurrency, not its place in the list), else at batch 1; never the
    recorded load's own decision, which ranks only the offered load."""
    from types import SimpleNamespace

    from runinfra_opt.optimize.decision import run
    from runinfra_opt.optimize.decision.batch1 import Batch1
    from runinfra_opt.results import Interval, LevelDecision
    from runinfra_opt.results.capacity import UNSATURATED

    gain = Interval(value=1.3, low=1.1, high=1.5)
    batch1 = Batch1(winner="ngram", reason="ngram 1.2x", gain=gain, ttft_change=None, per_category=[],
                    disqualified=[])  # fmt: skip

    def level(name: str, winner: str) -> LevelDecision:
        return LevelDecision(level=name, winner=winner, figure="output tokens/s", reason=f"{winner} at {name}",
                             gain=gain if winner != "baseline" else None)  # fmt: skip

    def fall_back(*levels: LevelDecision) -> Any:
        previous = run._Part(winner="baseline", gain=None, ttft_change=None, reason="every one kept up")
        results: Any = SimpleNamespace(load=SimpleNamespace(decisions=list(levels), deploy_level="replay"))
        return run.fall_back(results, batch1, previous, f"{UNSATURATED}; ngram kept up at every rate tried")

    decision = fall_back(
        level("replay", "baseline"), level("concurrency:16", "ngram"), level("concurrency:8", "baseline")
    )
    assert (decision.winner, decision.speculation, decision.gain) == ("ngram", True, gain)
    assert decision.reason == (
        f"Capacity does not decide ({UNSATURATED}; ngram kept up at every rate tried): by throughput at "
        "concurrency:16, the most loaded level measured: ngram at concurrency:16 (At the recorded load every variant "
        "kept up: every one kept up)"
    )
    decision = fall_back(
        level("replay", "baseline"), level("concurrency:8", "baseline"), level("concurrency:2", "ngram")
    )
    assert (decision.winner, decision.speculation) == ("baseline", False)
    assert decision.gain == Interval(value=1, low=1, high=1)
    assert "by throughput at concurrency:8, the most loaded level measured: baseline at" in decision.reason
    decision = fall_back(level("replay", "baseline"))  # no closed-loop level: batch 1
    assert (decision.winner, decision.speculation, decision.gain) == ("ngram", True, gain)
    assert "): by throughput at batch 1: ngram 1.2x (At the recorded load every variant kept up:" in decision.reason


def test_priority_capacity_keeps_the_searches_budget_first_and_says_when_it_is_short() -> None:
    """Before anything is timed: `--priority capacity` keeps what bracketing every launched server's capacity takes
    from the batch-1 timings' budget, and a budget too small for it is said, with the budget that would do."""
    from types import SimpleNamespace

    from runinfra_opt.engine.protocol import Capability
    from runinfra_opt.methods import Variant
    from runinfra_opt.objective import Objective
    from runinfra_opt.optimize.capacity import BRACKET_RUNS, search_need_s
    from runinfra_opt.optimize.phases import plan
    from runinfra_opt.workload.model import Request

    def state(priority: str, minutes: float) -> Any:
        notes: list[str] = []
        config = SimpleNamespace(objective=Objective.parse(priority), budget_minutes=minutes, confirm=2,
                                 capacity_requests=12)  # fmt: skip
        return SimpleNamespace(
            config=config, engine=SimpleNamespace(capabilities={Capability.SERVE_LOAD}),
            requests=[Request(id=f"r{i}", line=i + 1, prompt="x") for i in range(5)],
            space=[Variant("baseline"), *(Variant("vllm_ngram", lookahead=k, ngram_max=3) for k in (2, 4))],
            results=SimpleNamespace(add_note=notes.append), reporter=SimpleNamespace(note=lambda _: None),
            budget_left=lambda: minutes * 60, notes=notes,
        )  # fmt: skip

    one_second = state("capacity", 1.0)
    need, servers = plan._capacity_need(one_second, lambda _: 1.0)
    assert servers == 3  # the baseline and the two confirmed candidates
    assert need == pytest.approx(3 * search_need_s(one_second, 1.0))
    assert search_need_s(one_second, 1.0) > BRACKET_RUNS * 12  # three runs of 12 one-second requests, a warm-up
    plan._say_capacity_budget(one_second, need, servers, batch1_s=30.0)
    (note,) = one_second.notes
    assert note.startswith("--priority capacity: bracketing the capacity of each of the 3 server(s) it launches")
    assert f"--budget-minutes {math.ceil((need + 30) / 60):g} would bracket each" in note
    roomy = state("capacity", math.ceil((need + 30) / 60))
    plan._say_capacity_budget(roomy, need, servers, batch1_s=30.0)
    assert roomy.notes == []
    assert plan._capacity_need(state("throughput", 1.0), lambda _: 1.0) == (0.0, 0)
