"""Whether a small finding's saving could be measured at all: the steps' own variation.

The loop a user runs is profile, fix, measure (the mean step time before and after). A saving
of a few per cent that is smaller than what the steps vary by themselves cannot be told apart
by that measurement over as many steps as the capture analysed, so the report keeps such a
finding at `info` instead of asking for a fix nobody could confirm. Only `low` findings costed
in time (under 5 % of the window: rules/base.severity_for) are tested, and only where no finding
costs more: a larger cause makes the steps vary by itself (a stall in some steps, a straggler's
slow ones), so their spread is no noise floor then, for it or for the small ones beside it.

The test is the usual two-sample one on the steps' mean: over n steps before and n after, with
the steps' spread sigma (1.4826 x their median absolute deviation, robust to the one-off step),
a saving of d ms a step is told apart when d >= 2 * sigma * sqrt(2 / n), i.e. when the summed
saving is at least 2 * sigma * sqrt(2 * n). Sigma comes from the complete steps (a rank's last
step ends with its range, not at a next step's start, and is no sample of the loop's own time);
n is every analysed step, as the findings' savings count them. Under MIN_STEPS complete steps
there is no spread, and a measurement of so few steps tells apart no small saving: such a low
finding is info as well (a capture without steps has no loop to measure, and is not tested).

A saving estimated without the profiler (the capture's idle less nsys' estimated per-call cost)
carries that estimate's error too (its calibration's: capture_overhead's est_err_ns). It adds to
the measurement's in quadrature: the summed saving must be at least
2 * sqrt(2 * n * sigma^2 + err^2), or the finding is info.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding, Report, StepRow

# Fewer complete analysed steps than this say nothing about their spread.
MIN_STEPS = 4
# Standard errors a saving must exceed (about 95 % confidence).
Z = 2.0


@dataclass(frozen=True)
class StepNoise:
    """The analysed steps' spread: `sigma_ms` a step over `steps` steps, `complete` of them
    complete, and the smallest summed saving over them a before/after measurement of as many
    steps tells apart. Under MIN_STEPS complete steps there is no spread (sigma None): no saving
    a measurement of so few steps makes could be told from their variation."""

    steps: int
    sigma_ms: float | None
    complete: int = 0

    @property
    def floor_ms(self) -> float:
        return self.floor_with(0.0)

    def floor_with(self, err_ms: float) -> float:
        """The smallest summed saving told apart, where the saving itself is an estimate with
        standard error `err_ms` (0: measured)."""
        if self.sigma_ms is None:
            return math.inf
        return Z * math.sqrt(2 * self.steps * self.sigma_ms ** 2 + err_ms ** 2)


def analysed_steps(report: Report) -> list[StepRow]:
    """The job's analysed steps: the window's, the first one out unless --steps chose it. The
    findings' savings are over these."""
    chosen = report.window.steps
    return [s for s in report.steps if s.ms_by_rank and (chosen[0] <= s.step <= chosen[1] if chosen else not s.warmup)]


def step_ms(s: StepRow) -> float:
    """A step lasts as long as its slowest rank's."""
    return max(s.ms_by_rank.values())


def step_noise(report: Report) -> StepNoise | None:
    """The analysed steps and their spread (None: under MIN_STEPS complete ones), or None
    without an analysed step."""
    steps = analysed_steps(report)
    times = [step_ms(s) for s in steps if s.complete]
    return StepNoise(steps=len(steps), sigma_ms=_sigma(times), complete=len(times)) if steps else None


@dataclass(frozen=True)
class Pace:
    """A run's pace: its slowest rank's mean step over the analysed, complete steps that are no
    one-off (`paced` of them), out of `steps` analysed steps. What a fix saved is the pace it
    gained times the steps the findings' savings count; a one-off (a recompile, a communicator's
    creation) happens once a run with the fix or without it, and would swamp the mean of a short
    capture. Each rank's own mean, not the mean of each step's slowest rank: ranks that wait for
    each other in turn (one for its data, the others in the all-reduce) end their steps at other
    times, and the slowest of them in every step is longer than the period they all keep."""

    steps: int
    paced: int
    mean_ms: float
    sigma_ms: float | None = None  # the spread of that rank's paced steps (None under MIN_STEPS)


def oneoff_steps(report: Report) -> set[int]:
    """The numbers of the run's one-off steps."""
    return {s.step for s in report.steps if s.oneoff}


def pace(report: Report, leave_out: set[int] | None = None) -> Pace | None:
    """The run's pace, or None without an analysed complete step. `leave_out`: step numbers to
    leave out besides its own one-offs (another run's of the same loop, when two are compared
    step for step)."""
    steps = analysed_steps(report)
    skip = oneoff_steps(report) | (leave_out or set())
    paced = [s for s in steps if s.complete and s.step not in skip]
    by_rank: dict[str, list[float]] = {}
    for s in paced:
        for rk, ms in s.ms_by_rank.items():
            by_rank.setdefault(rk, []).append(ms)
    if not by_rank:
        return None
    slowest = max(by_rank.values(), key=statistics.fmean)
    return Pace(steps=len(steps), paced=len(paced), mean_ms=statistics.fmean(slowest), sigma_ms=_sigma(slowest))


def _sigma(times: list[float]) -> float | None:
    """1.4826 x the median absolute deviation: robust to a step that is no sample of the loop."""
    if len(times) < MIN_STEPS:
        return None
    med = statistics.median(times)
    return 1.4826 * statistics.median(abs(t - med) for t in times)


def paces(a: Report, b: Report) -> tuple[Pace, Pace] | None:
    """Two runs of the same loop, step for step: their paces with the steps one-off in either
    left out of both (a recompile, a communicator's creation happen once a run, fix or not)."""
    once = oneoff_steps(a) | oneoff_steps(b)
    pa, pb = pace(a, once), pace(b, once)
    return None if pa is None or pb is None else (pa, pb)


def pace_gap_floor(a: Pace, b: Pace) -> float | None:
    """The smallest difference of two paces told apart from the steps' own variation (the
    two-sample test on the means, Z standard errors), or None where a run has too few steps."""
    if a.sigma_ms is None or b.sigma_ms is None:
        return None
    return Z * math.sqrt(a.sigma_ms ** 2 / a.paced + b.sigma_ms ** 2 / b.paced)


def costed_in_time(f: Finding) -> bool:
    """Whether `f`'s severity is its time's share of the window (a memory finding's is not)."""
    return f.cost_pct is not None


def noise_floor(report: Report, found: list[Finding]) -> StepNoise | None:
    """The steps' spread where it is a noise floor: no finding costs medium or more in time."""
    if any(f.severity in ("high", "medium") and costed_in_time(f) for f in found):
        return None
    return step_noise(report)


def measurable(f: Finding, noise: StepNoise | None) -> Finding:
    """`f` as it is, or at `info` with the reason where it is `low` by the time it costs and its
    saving (without the profiler where the rule estimated that) is within the steps' own variation."""
    if noise is None or f.severity != "low" or not costed_in_time(f):
        return f
    saving = f.cost_ms if f.unprofiled_ms is None else f.unprofiled_ms
    err = f.unprofiled_err_ms or 0.0
    floor = noise.floor_with(err)
    if saving >= floor:
        return f
    # The reason first: the terminal shows a finding's first lines.
    said = f"{round(saving, 3)} ms{' without the profiler' if f.unprofiled_ms is not None else ''}"
    if noise.sigma_ms is None:
        why = (f"{said} over {noise.steps} analysed steps, of which {noise.complete} complete: under the "
               f"{MIN_STEPS} a spread needs, no before/after measurement of so few steps could tell it from "
               "what they vary by themselves, so it is `info`")
    else:
        within = (f", an estimate with a standard error of {round(err, 3)} ms (nsys' cost taken off it, from its "
                  "calibration), is within that error and what the steps vary by themselves" if err else
                  " is less than they vary by themselves")
        why = (f"{said} over the {noise.steps} analysed steps{within} (sigma {round(noise.sigma_ms, 3)} ms a step): "
               f"a before/after measurement of {noise.steps} steps each tells apart {round(floor, 3)} ms or more, "
               "so it is `info`")
    return f.model_copy(update={"severity": "info", "evidence": [why, *f.evidence]})
