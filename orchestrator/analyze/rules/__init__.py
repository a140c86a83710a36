"""The rules registry: every module here that defines `RULE` is a rule (see base.py).

Adding a finding is one new file in this package plus its test; nothing else changes.
`find_all` runs the ordinary rules, orders their findings by severity and cost, then runs
the final rules (which see the others' findings), the symptoms after the causes among them and
the summaries last.
"""

from __future__ import annotations

import importlib
import pkgutil

from orchestrator.analyze.measurable import measurable, noise_floor
from orchestrator.analyze.model_report import SEVERITY_ORDER, Finding
from orchestrator.analyze.rules.base import Context, Rule


def registry() -> list[Rule]:
    rules = []
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name == "base":
            continue
        rule = getattr(importlib.import_module(f"{__name__}.{mod.name}"), "RULE", None)
        if isinstance(rule, Rule):
            rules.append(rule)
    return rules


def rank_findings(found: list[Finding]) -> list[Finding]:
    """By severity; within one severity causes before symptoms (a rule with `symptom = True`
    says WHEN the GPU starves, the others say why), then by cost. A rule with `leads = True`
    (how the job ended) comes before all: what was measured in a job that did not complete
    reads differently once that is known."""
    rules = registry()
    symptoms = {r.kind for r in rules if r.symptom}
    leads = {r.kind for r in rules if r.leads}
    return sorted(found, key=lambda f: (f.kind not in leads, SEVERITY_ORDER[f.severity], f.kind in symptoms,
                                        -f.cost_ms))


def find_all(ctx: Context) -> list[Finding]:
    rules = registry()
    found = [f for r in rules if not r.final for f in r.evaluate(ctx.for_rule(r))]
    # A low finding whose saving the steps' own variation would hide is info, before the final
    # rules read the others' severities (measurable.py).
    noise = noise_floor(ctx.report, found)
    ctx.findings.extend(measurable(f, noise) for f in found)
    ctx.findings = rank_findings(ctx.findings)
    # A symptom's final rule defers to every cause found, the final causes' too: it runs after them.
    for rule in sorted((r for r in rules if r.final), key=lambda r: (r.summarises, r.symptom)):
        ctx.findings.extend(measurable(f, noise) for f in rule.evaluate(ctx.for_rule(rule)))
    # Final rules' findings take their place by severity and cost too; a summary (`healthy`:
    # info, no cost) stays after everything it summarises.
    last = {r.kind for r in rules if r.summarises}
    ctx.findings = sorted(rank_findings(ctx.findings), key=lambda f: f.kind in last)
    return ctx.findings
