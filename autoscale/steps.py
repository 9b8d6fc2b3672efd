"""``llmgw bench``'s arithmetic: percentiles, each step's verdict, the capacity, the chart. Pure.

A bench raises concurrency step by step (1, 2, 4, ... up to a limit) and measures,
at each step, TTFT and TPOT p99 against the model's SLO. The capacity is the
highest concurrency whose step met the SLO with no failed request, provided every
lower step met it too: a curve that fails at 4 and passes at 8 is noise, and the
lower figure is the one to trust.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BARS = " ▁▂▃▄▅▆▇█"


def p99(values: Sequence[float]) -> float | None:
    """The 99th percentile by the nearest-rank method (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(math.ceil(0.99 * len(ordered)), 1)
    return ordered[rank - 1]


def schedule(start: int, limit: int) -> list[int]:
    """Concurrency levels: doubling from ``start`` up to ``limit`` (which is always tried)."""
    out, level = [], max(start, 1)
    while level < limit:
        out.append(level)
        level *= 2
    out.append(limit)
    return out


@dataclass(frozen=True, slots=True)
class Step:
    concurrency: int
    requests: int
    errors: int
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    seconds: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Verdict:
    step: Step
    meets: bool
    why: str

    def to_json(self) -> dict[str, Any]:
        s = self.step
        return {
            "concurrency": s.concurrency,
            "requests": s.requests,
            "errors": s.errors,
            "ttft_p99_s": s.ttft_p99_s,
            "tpot_p99_s": s.tpot_p99_s,
            "requests_per_s": round(s.rate, 3),
            "meets_slo": self.meets,
            "why": self.why,
        }


def judge(step: Step, ttft_slo: float | None, tpot_slo: float | None) -> Verdict:
    """Whether a step met the SLO, and the numbers that say so."""
    misses = []
    if step.requests == 0:
        return Verdict(step, False, "no request completed")
    if step.errors:
        misses.append(f"{step.errors} of {step.requests} failed")
    if ttft_slo and (step.ttft_p99_s is None or step.ttft_p99_s > ttft_slo):
        misses.append(f"ttft p99 {_s(step.ttft_p99_s)} > {ttft_slo:g}s")
    if tpot_slo and (step.tpot_p99_s is None or step.tpot_p99_s > tpot_slo):
        misses.append(f"tpot p99 {_s(step.tpot_p99_s)} > {tpot_slo:g}s")
    if misses:
        return Verdict(step, False, "; ".join(misses))
    return Verdict(step, True, "meets the SLO")


def _s(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}s"


def capacity(verdicts: Sequence[Verdict]) -> int:
    """The highest concurrency met with every lower step met too; 0 if the first missed."""
    found = 0
    for v in sorted(verdicts, key=lambda v: v.step.concurrency):
        if not v.meets:
            break
        found = v.step.concurrency
    return found


def should_stop(verdicts: Sequence[Verdict]) -> bool:
    """Stop raising once a step missed: the capacity is known, and more load only hurts."""
    return bool(verdicts) and not verdicts[-1].meets


def sparkline(values: Sequence[float | None]) -> str:
    """One character per value, from the lowest bar to the highest (blank for none)."""
    present = [v for v in values if v is not None]
    if not present:
        return " " * len(values)
    top = max(present) or 1.0
    return "".join(
        " " if v is None else BARS[max(1, round(v / top * (len(BARS) - 1)))] for v in values
    )


def chart(verdicts: Sequence[Verdict], slo: float | None, width: int = 40) -> list[str]:
    """TTFT p99 per step as horizontal bars, with the SLO marked as ``|``."""
    values = [v.step.ttft_p99_s or 0.0 for v in verdicts]
    top = max([*values, slo or 0.0]) or 1.0
    mark = None if not slo else min(round(slo / top * width), width)
    lines = []
    for v, value in zip(verdicts, values, strict=True):
        cells = ["#"] * round(value / top * width) + [" "] * (width - round(value / top * width))
        if mark is not None:
            cells.insert(mark, "|")
        ok = "ok" if v.meets else "MISS"
        lines.append(f"{v.step.concurrency:>5} {''.join(cells)} {value:.3f}s {ok}")
    return lines
