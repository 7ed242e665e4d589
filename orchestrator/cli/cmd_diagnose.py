"""`diagnose RUN`: dump and read every rank of a running run
(orchestrator/run/diagnose.py, orchestrator/diagnosis/dumps.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..run.diagnose import diagnose_run
from . import values


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diagnose", help="dump every rank's stack of a running run and "
                       "name the rank that holds the others up",
                       description="For a run that looks slow or stuck (attached or "
                       "detached): a py-spy dump of every worker on every node, grouped "
                       "by where the ranks are; the odd ones out are named. The run goes "
                       "on undisturbed.")
    p.add_argument("run", type=values.run_id, help="run id (see `python -m orchestrator runs`)")
    p.add_argument("--native", action="store_true",
                   help="with C/C++ frames (slower; shows where in torch a rank waits)")
    p.add_argument("--json", action="store_true", help="print the analysis as JSON")
    values.add_runs_dir(p)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    diagnosis = diagnose_run(Path(args.runs_dir), args.run, native=args.native)
    print(json.dumps(diagnosis.to_json(), indent=2) if args.json else diagnosis.report())
    return 0 if diagnosis.analysis else 1
