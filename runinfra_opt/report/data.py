"""Machine-readable renderings of one run: JSON (the results file itself) and CSV tables via pandas."""

from __future__ import annotations

import io
import json
from typing import Any, Literal

from runinfra_opt.records import RequestRecord
from runinfra_opt.report import view
from runinfra_opt.results import RunResults, Summary

CsvKind = Literal["variants", "requests", "load"]
CSV_KINDS: tuple[CsvKind, ...] = ("variants", "requests", "load")


def render_json(results: RunResults) -> str:
    """The full results, as `optimize` wrote them (schema-versioned; `load_results` reads it back)."""
    return results.model_dump_json(indent=2) + "\n"


def _summary_columns(prefix: str, summary: Summary | None) -> dict[str, Any]:
    s = summary
    interval = s.tokens_per_s_interval if s else None
    speedup = s.speedup if s else None
    return {
        f"{prefix}_tokens_per_s": s.tokens_per_s if s else None,
        f"{prefix}_tokens_per_s_low": interval.low if interval else None,
        f"{prefix}_tokens_per_s_high": interval.high if interval else None,
        f"{prefix}_speedup": speedup.value if speedup else None,
        f"{prefix}_speedup_low": speedup.low if speedup else None,
        f"{prefix}_speedup_high": speedup.high if speedup else None,
        f"{prefix}_ttft_p50_ms": s.ttft_s["p50"] * 1000 if s and "p50" in s.ttft_s else None,
        f"{prefix}_ttft_p95_ms": s.ttft_s["p95"] * 1000 if s and "p95" in s.ttft_s else None,
        f"{prefix}_tpot_p50_ms": s.tpot_s["p50"] * 1000 if s and "p50" in s.tpot_s else None,
        f"{prefix}_acceptance_rate": s.acceptance_rate if s else None,
        f"{prefix}_mean_accepted_per_pass": s.mean_accepted_per_pass if s else None,
    }


def variants_frame(results: RunResults) -> Any:
    """One row per variant (report order): parameters, status, predicted and measured figures."""
    import pandas as pd

    records = []
    rows = {row.name: row for row in view.variant_rows(results)}
    for name, row in rows.items():
        result = results.variant(name)
        assert result is not None
        variant = view.variant_of(result)
        record: dict[str, Any] = {
            "variant": name,
            "method": row.method,
            "lookahead": row.lookahead,
            "draft": variant.draft if variant else None,
            "ngram_max": variant.ngram_max if variant else None,
            "exit_layer": variant.exit_layer if variant else None,
            "status": row.status,
            "confirmed": row.confirmed,
            "lossless": row.lossless,
            "near_ties_only": row.near_ties_only,
            "disqualified": row.disqualified,
            "ruled_out": "; ".join(row.ruled_out) or None,
            "prediction_error": row.prediction_error,
        }
        record.update(_summary_columns("predicted", result.predicted))
        record.update(_summary_columns("measured", result.measured))
        records.append(record)
    frame = pd.DataFrame.from_records(records, columns=VARIANT_CSV_COLUMNS)
    return frame.astype({"lookahead": "Int64", "ngram_max": "Int64", "exit_layer": "Int64"})


_REQUEST_FIELDS = tuple(f for f in RequestRecord.model_fields if f not in ("output_ids", "variant"))
VARIANT_CSV_COLUMNS = (
    ["variant", "method", "lookahead", "draft", "ngram_max", "exit_layer", "status", "confirmed", "lossless"]
    + ["near_ties_only"]
    + ["disqualified", "ruled_out", "prediction_error"]
    + list(_summary_columns("predicted", None))
    + list(_summary_columns("measured", None))
)
REQUEST_CSV_COLUMNS = ["variant", "source", *_REQUEST_FIELDS]


def requests_frame(results: RunResults) -> Any:
    """One row per variant x source (measured, predicted) x request x repeat; `accepted_per_pass` is a JSON
    list."""
    import pandas as pd

    records = []
    for result in results.variants:
        for source, requests in (("measured", result.measured_requests), ("predicted", result.predicted_requests)):
            for request in requests:
                record = {"variant": result.name, "source": source, **request.model_dump(include=set(_REQUEST_FIELDS))}
                record["accepted_per_pass"] = json.dumps(request.accepted_per_pass)
                records.append(record)
    frame = pd.DataFrame.from_records(records, columns=REQUEST_CSV_COLUMNS)
    return frame.astype({"first_mismatch": "Int64"})


def render_csv(results: RunResults, kind: CsvKind = "variants") -> str:
    """A CSV table: `variants` (one row per variant), `requests` (one row per request measurement) or `load`
    (one row per variant x load level; the header only for a run without load)."""
    if kind == "variants":
        frame = variants_frame(results)
    elif kind == "requests":
        frame = requests_frame(results)
    elif kind == "load":
        from runinfra_opt.report.load import load_frame

        frame = load_frame(results)
    else:
        from runinfra_opt.errors import UserInputError

        raise UserInputError(f"unknown CSV kind {kind!r}; available: {', '.join(CSV_KINDS)}")
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, lineterminator="\n")
    return buffer.getvalue()
