"""`doctor`: measure every link and node and name the bad ones
(orchestrator/workloads/doctor_run.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from ..cluster.inventory import Cluster
from ..workloads.doctor_run import DoctorReport, DoctorRequest, render, run_doctor, thresholds
from . import values
from .cmd_preflight import add_python_env_arg, add_selection_args, selected


def add_measure_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--link-seconds", type=float, default=DoctorRequest.link_seconds,
                   help="seconds of traffic per direction of each link (default: "
                   "%(default)s)")
    p.add_argument("--allreduce-mb", type=float, default=DoctorRequest.allreduce_mb,
                   help="size of the all_reduce, in MB (default: %(default)s)")


def parse_request(args: argparse.Namespace) -> DoctorRequest:
    return DoctorRequest(link_seconds=args.link_seconds, allreduce_mb=args.allreduce_mb,
                         runs_dir=Path(args.runs_dir),
                         master_port=getattr(args, "master_port", None),
                         share_gpus=getattr(args, "share_gpus", False))


def diagnose_cluster(cluster: Cluster, request: DoctorRequest, as_json: bool) -> DoctorReport:
    """Run doctor and print its report (with AS_JSON, only the JSON on standard output:
    the run's own lines go to standard error)."""
    if as_json:
        with contextlib.redirect_stdout(sys.stderr):
            report = run_doctor(cluster, request)
        print(json.dumps(report.to_json(), indent=2))
    else:
        report = run_doctor(cluster, request)
        print(render(report))
    return report


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="measure every link and node; name the slow ones",
                       description="Bandwidth and round trip of every pair of nodes, both "
                       "ways, in rounds of disjoint pairs; a whole-world all_reduce (gloo "
                       "on CPUs, NCCL on GPUs); matrix products on every rank; nvidia-smi's "
                       "ECC, clock and PCIe checks. It runs as a job (runs/RUN/, with "
                       f"doctor.json). Suspect when: {thresholds()['rule']}. Exit 1 when "
                       "a node is named.")
    add_selection_args(p)
    add_python_env_arg(p)
    add_measure_args(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--share-gpus", action="store_true",
                   help="measure even on nodes another run or GPU process uses (their "
                   "numbers then tell of both)")
    values.add_runs_dir(p)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    request = parse_request(args)
    cluster = selected(args)
    return 1 if diagnose_cluster(cluster, request, args.json).suspects else 0
