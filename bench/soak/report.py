"""The soak's verdicts (verdicts.json) and its report (report.html): the seed and how to
run it again, each invariant's verdict with each violation's evidence and the actions and
faults around it (history.around), what the executor could not do (never counted as
passed), the runs per hour and the whole timeline of actions and faults.

Standard library only: rendered from a fixed history and verdicts in the tests.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .history import Event, RunSeen, Violation, around

NOT_IMPLEMENTED = "not implemented"


@dataclass(frozen=True)
class Soak:
    """What a soak was: its seed and length, the sandbox, how to run it again."""
    seed: int
    minutes: float
    sandbox: str
    command: str
    started: str                      # ISO time of its start
    notes: tuple[str, ...] = field(default_factory=tuple)


def plain(value: Any) -> Any:
    """VALUE as JSON can hold it (the history's dataclasses as objects)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    return value


def not_implemented(history: list[Event]) -> list[Event]:
    """The actions and faults the executor recorded as not done (info: not implemented)."""
    return [e for e in history if e.kind == "info" and e.result.startswith(NOT_IMPLEMENTED)]


def counts(history: list[Event]) -> dict[str, dict[str, int]]:
    """Actions by verb and how they ended; faults by kind."""
    ends: dict[str, Counter[str]] = defaultdict(Counter)
    for e in history:
        if e.actor == "nemesis":
            if e.kind == "fault":
                ends[e.what]["fault"] += 1
            elif e.kind == "info":
                ends[e.what]["info"] += 1
        elif e.kind in ("ok", "fail", "info"):
            ends[e.what][e.kind] += 1
    return {what: dict(c) for what, c in sorted(ends.items())}


def runs_per_hour(runs: list[RunSeen]) -> dict[int, dict[str, int]]:
    """Each hour of the soak (0 = the first): its runs' end states, by the run's start."""
    hours: dict[int, Counter[str]] = defaultdict(Counter)
    for run in runs:
        hours[int(run.start // 3600)][run.status] += 1
    return {h: dict(c) for h, c in sorted(hours.items())}


def verdicts_json(soak: Soak, results: Mapping[str, list[Violation]], history: list[Event],
                  runs: list[RunSeen]) -> dict[str, Any]:
    """verdicts.json: the soak, each invariant's violations (held: none) with the history
    around each, what was not implemented, the counts."""
    return {
        "soak": plain(soak),
        "held": all(not found for found in results.values()),
        "invariants": {name: {"held": not found, "violations": [
            {**plain(v), "around": [e.line() for e in around(history, v.at)]}
            for v in found]} for name, found in results.items()},
        "not_implemented": [e.line() for e in not_implemented(history)],
        "counts": counts(history),
        "runs": len(runs),
        "runs_per_hour": runs_per_hour(runs),
    }


CSS = """body{font-family:sans-serif;margin:2em;max-width:1200px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left;
vertical-align:top}pre{background:#f6f6f6;padding:6px;overflow-x:auto;font-size:90%}
.held{color:#070}.broken{color:#b00;font-weight:bold}.fault{background:#fee}
.heal{background:#efe}.fail{color:#b00}.info{color:#777}"""


def _e(text: object) -> str:
    return html.escape(str(text))


def render(soak: Soak, results: Mapping[str, list[Violation]], history: list[Event],
           runs: list[RunSeen]) -> str:
    """report.html: what a person needs to judge the soak and reproduce a violation."""
    broken = sum(len(found) for found in results.values())
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>soak seed {soak.seed}"
           f"</title><style>{CSS}</style></head><body>",
           f"<h1>Soak, seed {soak.seed}: "
           + (f"<span class='broken'>{broken} violation(s)</span>" if broken
              else "<span class='held'>every invariant held</span>") + "</h1>",
           f"<p>{soak.minutes:g} minutes on sandbox <code>{_e(soak.sandbox)}</code>, begun "
           f"{_e(soak.started)}. The same seed gives the same schedule: run it again with "
           f"<code>{_e(soak.command)}</code>.</p>"]
    out += [f"<p>{_e(n)}</p>" for n in soak.notes]
    out.append("<h2>Invariants</h2><table><tr><th>invariant</th><th>verdict</th></tr>")
    for name, found in results.items():
        verdict = (f"<span class='broken'>{len(found)} violation(s)</span>" if found
                   else "<span class='held'>held</span>")
        out.append(f"<tr><td><a href='#{_e(name)}'>{_e(name)}</a></td><td>{verdict}</td></tr>")
    out.append("</table>")
    for name, found in results.items():
        if not found:
            continue
        out.append(f"<h3 id='{_e(name)}'>{_e(name)}</h3>")
        for v in found:
            near = "\n".join(e.line() for e in around(history, v.at))
            out.append(f"<p class='broken'>{_e(v.what)} (at {v.at:.1f} s)</p>"
                       f"<pre>{_e(json.dumps(plain(v.evidence), indent=1, default=str))}</pre>"
                       f"<p>The actions and faults around it:</p><pre>{_e(near)}</pre>")
    missing = not_implemented(history)
    out.append(f"<h2>Not done: {len(missing)} action(s) the executor cannot do yet</h2>"
               "<p>Recorded, not counted as passed.</p>")
    by_what = Counter(e.what for e in missing)
    if by_what:
        out.append("<ul>" + "".join(f"<li>{_e(w)}: {n}</li>" for w, n in sorted(by_what.items()))
                   + "</ul>")
    out.append("<h2>Actions and faults</h2><table><tr><th>verb or fault</th><th>ends</th></tr>")
    for what, ends in counts(history).items():
        said = ", ".join(f"{k} {n}" for k, n in sorted(ends.items()))
        out.append(f"<tr><td>{_e(what)}</td><td>{_e(said)}</td></tr>")
    out.append("</table><h2>Runs per hour</h2><table><tr><th>hour</th><th>runs</th></tr>")
    for hour, states in runs_per_hour(runs).items():
        said = ", ".join(f"{k} {n}" for k, n in sorted(states.items()))
        out.append(f"<tr><td>{hour}</td><td>{sum(states.values())}: {_e(said)}</td></tr>")
    out.append("</table><h2>Runs</h2><table><tr><th>run</th><th>user</th><th>status</th>"
               "<th>allowed</th><th>start</th><th>end</th><th>nodes</th></tr>")
    for r in sorted(runs, key=lambda r: r.start):
        end = "" if r.end is None else f"{r.end:.0f} s"
        out.append(f"<tr><td>{_e(r.run_id)}</td><td>{_e(r.user)}</td><td>{_e(r.status)}</td>"
                   f"<td>{_e(', '.join(r.allowed))}</td><td>{r.start:.0f} s</td><td>{end}</td>"
                   f"<td>{_e(', '.join(r.nodes))}</td></tr>")
    out.append("</table><h2>Timeline</h2><table><tr><th>t</th><th>who</th><th>kind</th>"
               "<th>what</th><th>args</th><th>result</th></tr>")
    for e in sorted(history, key=lambda e: e.t):
        args = " ".join(f"{k}={v}" for k, v in sorted(e.args.items()) if k != "cmd")
        out.append(f"<tr class='{_e(e.kind)}'><td>{e.t:.1f}</td><td>{_e(e.actor)}</td>"
                   f"<td>{_e(e.kind)}</td><td>{_e(e.what)}</td><td>{_e(args)}</td>"
                   f"<td>{_e(e.result)}</td></tr>")
    out.append("</table></body></html>\n")
    return "\n".join(out)
