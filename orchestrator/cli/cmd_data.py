"""`data cifar10|synthetic`: put a dataset on the share (orchestrator/provision/data.py)."""

from __future__ import annotations

import argparse

from ..provision.data import (
    CIFAR10_MD5,
    CIFAR10_URL,
    DataError,
    SyntheticSpec,
    fetch_cifar10,
    write_synthetic,
)
from . import values

DEST = values.path("the directory to write the dataset in")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="put a training dataset on the shared storage",
                       description="Write a dataset in CIFAR-10's python-batch format to "
                       "DEST/cifar-10-batches-py, where train/train.py --data-dir DEST "
                       "reads it.")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="DATASET")

    v = verbs.add_parser("cifar10", help="the real CIFAR-10 (download or --archive)",
                         description=f"Download {CIFAR10_URL} (or take --archive), verify "
                         "its MD5 and unpack it.")
    v.add_argument("--dest", type=DEST, required=True,
                   help="target directory, e.g. /mnt/cluster/data/cifar10")
    v.add_argument("--archive", type=values.path("a cifar-10-python.tar.gz"), default=None,
                   help="a local cifar-10-python.tar.gz (air-gapped clusters)")
    v.add_argument("--url", default=CIFAR10_URL, type=values.text("a download address"),
                   help="download from a mirror instead")
    v.add_argument("--md5", default=CIFAR10_MD5, type=values.text("the archive's MD5"),
                   help="expected MD5 of the archive (default: the official one)")
    v.add_argument("--force", action="store_true", help="replace an existing copy")
    v.set_defaults(func=_cifar10)

    v = verbs.add_parser("synthetic", help="a small learnable dataset in the same format",
                         description="Each class is a random pattern of coloured 8x8 "
                         "blocks plus per-pixel noise: a CNN learns it in a few epochs, "
                         "so a working training run ends far above chance.")
    v.add_argument("--dest", type=DEST, required=True)
    v.add_argument("--train-per-class", type=int, default=100)
    v.add_argument("--test-per-class", type=int, default=20)
    v.add_argument("--classes", type=int, default=10)
    v.add_argument("--noise", type=int, default=64, help="per-pixel noise amplitude, 0-127")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--force", action="store_true", help="replace an existing dataset")
    v.set_defaults(func=_synthetic)


def _cifar10(args: argparse.Namespace) -> int:
    if len(args.md5) != 32 or any(c not in "0123456789abcdefABCDEF" for c in args.md5):
        raise DataError(f"--md5 {args.md5!r} is not an MD5 digest (32 hex digits)")
    fetch_cifar10(args.dest, archive=args.archive, url=args.url, md5=args.md5, force=args.force)
    return 0


def _synthetic(args: argparse.Namespace) -> int:
    spec = SyntheticSpec(train_per_class=args.train_per_class,
                         test_per_class=args.test_per_class, classes=args.classes,
                         noise=args.noise, seed=args.seed)
    write_synthetic(args.dest, spec, force=args.force)
    return 0
