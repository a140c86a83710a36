"""`orch sweep`: one job per value of some spec keys, submitted, collected and compared."""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path

from orchestrator.cli.common import Handler, check_output_file, err, out, positive_float, runs_opt


def cmd_sweep(a: argparse.Namespace) -> int:
    from orchestrator.fsutil import write_text_atomic
    from orchestrator.report.sweep_render import print_sweep, render_sweep_html
    from orchestrator.sweep import combinations, parse_set, run_sweep

    check_output_file(a.json, "--json")
    check_output_file(a.html, "--html")
    sets = [parse_set(s) for s in a.set]
    combinations(sets)  # a bad --set fails before any job is submitted
    s = run_sweep(Path(a.job), sets, Path(a.runs) if a.runs else None, a.timeout,
                  log=lambda line: err.print(line, markup=False, highlight=False))
    print_sweep(s, out)
    folder = Path(s.points[0].run or ".").parent / f"sweep-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    html = Path(a.html) if a.html else folder / "sweep.html"
    js = Path(a.json) if a.json else folder / "sweep.json"
    for f in (html, js):
        f.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(js, s.model_dump_json(indent=1))
    write_text_atomic(html, render_sweep_html(s, html))
    out.print(f"wrote {html} and {js}", markup=False)
    return 0 if s.best is not None and all(p.state == "COMPLETED" for p in s.points) else 1


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    p = sub.add_parser("sweep", help="one job per value of spec keys (--set K=V1,V2), compared side by side")
    p.add_argument("job")
    p.add_argument("--set", action="append", required=True, metavar="KEY=V1,V2",
                   help="dotted spec key and its values, e.g. launch.env.NUM_WORKERS=0,2,4 (repeat: combinations)")
    p.add_argument("--timeout", type=positive_float("--timeout 600"), default=None,
                   help="stop waiting for each job after this many seconds")
    p.add_argument("--html", help="the side-by-side HTML (default: sweep.html in a new folder by the runs)")
    p.add_argument("--json", help="the results as JSON (default: sweep.json next to the HTML)")
    runs_opt(p)
    return {"sweep": cmd_sweep}
