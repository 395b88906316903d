"""Read Prometheus text exposition and estimate histogram quantiles.

Only what the e2e summary needs: parse samples, sum a histogram's buckets over
the label sets a predicate keeps, subtract an earlier scrape, and estimate a
quantile the way PromQL's histogram_quantile does (linear inside a bucket; the
largest finite bound when the rank falls in +Inf).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Iterable

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict
    value: float


def parse(text: str) -> list[Sample]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(3) or ""))
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        out.append(Sample(m.group(1), labels, value))
    return out


def total(samples: Iterable[Sample], name: str, keep: Callable[[dict], bool] = lambda _l: True) -> float:
    return sum(s.value for s in samples if s.name == name and keep(s.labels))


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), sorted, +Inf last
    count: float

    def minus(self, earlier: "Histogram | None") -> "Histogram":
        if earlier is None:
            return self
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
            self.count - earlier.count,
        )

    def quantile(self, q: float) -> float | None:
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank:
                if math.isinf(le):
                    return prev_le
                if c == prev_c:
                    return le
                return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
            prev_le, prev_c = le, c
        return prev_le


def histogram(samples: Iterable[Sample], name: str, keep: Callable[[dict], bool]) -> Histogram:
    sums: dict[float, float] = {}
    count = 0.0
    for s in samples:
        if not keep(s.labels):
            continue
        if s.name == name + "_bucket":
            le = float(s.labels["le"])
            sums[le] = sums.get(le, 0.0) + s.value
        elif s.name == name + "_count":
            count += s.value
    return Histogram(tuple(sorted(sums.items())), count)
