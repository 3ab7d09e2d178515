"""The held-out split: a deterministic, category-stratified fraction of a workload's requests."""

from __future__ import annotations

import hashlib
from collections import defaultdict

from runinfra_opt.workload.model import Request


def _order_key(request: Request) -> str:
    # Hash order, not file order: the split does not change when the file is reordered, and it does not
    # pick the first requests of each category (which are often the simplest).
    return hashlib.sha256(f"{request.category}\0{request.id}".encode()).hexdigest()


def holdout_split(requests: tuple[Request, ...] | list[Request], fraction: float) -> tuple[list[int], list[int]]:
    """(train indices, held-out indices) into `requests`, each in file order.

    Per category, round(fraction * n) requests are held out, at least one when fraction > 0 and the category
    has two or more requests, and never all of a category's requests.
    """
    by_category: dict[str, list[int]] = defaultdict(list)
    for index, request in enumerate(requests):
        by_category[request.category].append(index)
    held: set[int] = set()
    for indices in by_category.values():
        n = len(indices)
        count = round(fraction * n)
        if fraction > 0 and n >= 2:
            count = max(count, 1)
        count = min(count, n - 1) if n >= 2 else 0
        ranked = sorted(indices, key=lambda i: _order_key(requests[i]))
        held.update(ranked[:count])
    train = [i for i in range(len(requests)) if i not in held]
    return train, sorted(held)
