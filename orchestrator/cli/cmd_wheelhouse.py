"""`wheelhouse`: build the wheelhouse the nodes install from
(orchestrator/provision/wheelhouse.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..provision.envfile import check_python_version
from ..provision.wheelhouse import LOCK, WheelhouseRequest, build


def _python_version(value: str) -> str:
    """The type of --python-version: X.Y or X.Y.Z, refused by argparse otherwise."""
    try:
        return check_python_version(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "wheelhouse", help="download the environment's pip packages for offline nodes",
        description="Download the pip: section of a conda-style environment file into a "
        "directory of wheels, for `pip install --no-index --find-links DIR` on nodes "
        "(variable python_env_wheelhouse). Does nothing when DIR is already up to date.")
    p.add_argument("--env", type=Path, default=Path("environment.yml"),
                   help="environment file (default: environment.yml)")
    p.add_argument("--dest", type=Path, required=True, help="wheelhouse directory")
    p.add_argument("--python-version", type=_python_version, help="nodes' python, e.g. "
                   "3.11, when it differs from this machine's (wheels only)")
    p.add_argument("--platform", help="nodes' wheel platform, e.g. manylinux_2_28_x86_64, "
                   "when it differs from this machine's (wheels only)")
    p.add_argument("--extra-index-url", help="extra package index, e.g. "
                   "https://download.pytorch.org/whl/cu128 for CUDA builds of torch")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    result = build(WheelhouseRequest(env_file=args.env, dest=args.dest,
                                     python_version=args.python_version,
                                     platform=args.platform,
                                     extra_index_url=args.extra_index_url))
    state = "up to date" if result.up_to_date else "built"
    print(f"wheelhouse {result.dest}: {state}, {len(result.files)} files for Python "
          f"{result.python_version}, sha256 of each in {LOCK}")
    if result.conda_only:
        print(f"note: {args.env} also asks conda for {', '.join(result.conda_only)}: not in the "
              "wheelhouse, which holds its pip: section. The conda backend installs them "
              "from its channels; the venv backend refuses them (move them to pip: to have "
              "them here)")
    return 0
