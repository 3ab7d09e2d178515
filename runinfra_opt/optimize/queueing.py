"""TTFT under recorded load: a simulated single-replica FIFO queue (one request served at a time).

Requests arrive at their recorded times; each occupies the replica for its measured end-to-end time and sees
its first token `wait + ttft` after arriving. The result is labelled simulated: it replays measured service
times, it does not measure a server under load (batching servers overlap requests; this one does not).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from runinfra_opt import stats
from runinfra_opt.records import RequestRecord
from runinfra_opt.results import QueueSimulation


def simulate_fifo(
    variant: str, arrivals_s: Sequence[float], services: Sequence[tuple[float, float]]
) -> QueueSimulation:
    """Replay a FIFO queue. `services[i]` = (ttft_s, e2e_s) of the request arriving at `arrivals_s[i]`.
    Returns TTFT-with-queueing percentiles, the mean wait and the replica's utilisation (busy time over
    the span from the first arrival to the last completion)."""
    if len(arrivals_s) != len(services):
        raise ValueError(f"{len(arrivals_s)} arrival times but {len(services)} service times")
    if not services:
        raise ValueError("no requests to queue")
    order = sorted(range(len(services)), key=lambda i: (arrivals_s[i], i))
    free_at = float("-inf")
    waits, ttfts = [], []
    busy = 0.0
    for i in order:
        arrival = float(arrivals_s[i])
        ttft, e2e = services[i]
        start = max(arrival, free_at)
        waits.append(start - arrival)
        ttfts.append(start - arrival + ttft)
        free_at = start + e2e
        busy += e2e
    span = free_at - min(arrivals_s)
    return QueueSimulation(
        variant=variant,
        ttft_s=stats.percentiles(ttfts),
        mean_wait_s=statistics.fmean(waits),
        utilisation=busy / span if span > 0 else 1.0,
    )


def service_times(records: Sequence[RequestRecord]) -> dict[str, tuple[float, float]]:
    """Per request id: the median (ttft_s, e2e_s) over its repeats."""
    grouped: dict[str, list[RequestRecord]] = {}
    for r in records:
        grouped.setdefault(r.request_id, []).append(r)
    return {
        rid: (statistics.median(r.ttft_s for r in group), statistics.median(r.e2e_s for r in group))
        for rid, group in grouped.items()
    }


def simulate_variants(
    arrivals_s: Mapping[str, float | None], records_by_variant: Mapping[str, Sequence[RequestRecord]]
) -> list[QueueSimulation]:
    """A FIFO simulation per variant over the requests that have a recorded arrival time and a measurement.
    Empty when the workload records no arrival times."""
    out = []
    for variant, records in records_by_variant.items():
        services = service_times(records)
        ids = [rid for rid in services if arrivals_s.get(rid) is not None]
        if not ids:
            continue
        out.append(
            simulate_fifo(variant, [float(arrivals_s[rid] or 0.0) for rid in ids], [services[rid] for rid in ids])
        )
    return out
