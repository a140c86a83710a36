"""ns -> ms, the one conversion between the store (ns) and the report (ms).

The report shows µs (3 decimals) by default; the stats tables keep ns precision (6 decimals)
because they are compared with nsys's own ns numbers.
"""

from __future__ import annotations

from decimal import Decimal

Ns = float | int | Decimal


def ms(ns: Ns | None, digits: int = 3) -> float:
    """`ns` in ms rounded to `digits` decimals; None counts as 0 (a rule's missing metric).

    An integer count of ns needs no rounding at 6 digits or more: n / 1e6 is the double
    nearest to the 6-decimal n / 10^6, which is what round() would return (checked on 3 M
    random integers up to 2^62). round() is a large share of the report's Python at many ranks
    (docs/benchmarks-code.md), so it is skipped there."""
    if ns is None:
        return 0.0
    if type(ns) is int:
        return ns / 1e6 if digits >= 6 else round(ns / 1e6, digits)
    return round(float(ns) / 1e6, digits)


def ms_or_none(ns: Ns | None, digits: int = 3) -> float | None:
    """`ms`, keeping a missing value missing (a metric the capture cannot give)."""
    return None if ns is None else ms(ns, digits)


def ms6(ns: Ns | None) -> float | None:
    """`ms_or_none(ns, 6)` in one call: the stats tables keep ns precision (they are compared with
    nsys's ns numbers) and convert every number of every row they keep, about 100k at 64 ranks."""
    if ns is None:
        return None
    return ns / 1e6 if type(ns) is int else round(float(ns) / 1e6, 6)
