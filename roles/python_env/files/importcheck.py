"""Import the packages an environment file names, in the environment (clustertrain).

Run by the python_env role with the environment's own python once the environment is
realised, before it is named ready (python_env.json): packages that install but do not
import together (a torchvision built for another torch) fail here, not in the first run.
Standard library only.

    importcheck.py [--pip LINE]... [--conda LINE]...

LINE: a line of the file's pip: section or of its conda dependencies, as written. Each
names a distribution; its import names come from its metadata (top_level.txt, else its
RECORD; a conda package's from conda-meta/), the one named like the distribution when
there is one, else all of them. Prints one JSON object, its last line:
{"imported": {package: [modules]}, "failed": [{"package", "module", "error"}],
"not_installed": [names]} ("error": the exception's own last line); exit 1 when one failed.
"""

import argparse
import contextlib
import glob
import importlib
import importlib.metadata as metadata
import json
import os
import re
import sys
import traceback

PIP_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
CONDA_NAME = re.compile(r"\s*(?:[^\s:]+::)?([A-Za-z0-9_][A-Za-z0-9_.-]*)")
NOT_PACKAGES = {"python", "pip"}          # conda's interpreter and installer
NOT_MODULES = {"test", "tests", "doc", "docs", "example", "examples", "benchmarks"}


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def named(pip_lines, conda_lines):
    """The distributions the lines name, canonical, once each, in their order (pip's own
    options, `--extra-index-url URL`, name none)."""
    names = [m.group(1) for m in (PIP_NAME.match(x) for x in pip_lines
                                  if not x.strip().startswith("-")) if m]
    names += [m.group(1) for m in map(CONDA_NAME.match, conda_lines) if m]
    return [n for n in dict.fromkeys(map(canonical, names)) if n not in NOT_PACKAGES]


def module_of(path):
    """The top-level module a file of a distribution belongs to (None: none)."""
    parts = path.replace("\\", "/").split("/")
    top = parts[0]
    if top in ("", "..", "__pycache__") or top.endswith((".dist-info", ".egg-info", ".data")):
        return None
    if len(parts) > 1:
        return top if top.isidentifier() else None
    stem = top.split(".")[0]
    return stem if top.endswith((".py", ".so", ".pyd")) and stem.isidentifier() else None


def conda_modules(name):
    """The top-level modules a conda package put in site-packages (its conda-meta record)."""
    found = []
    for record in glob.glob(os.path.join(sys.prefix, "conda-meta", "*.json")):
        try:
            with open(record) as fh:
                meta = json.load(fh)
        except (OSError, ValueError):
            continue
        if canonical(meta.get("name", "")) == name:
            found += [module_of(f.split("/site-packages/", 1)[1])
                      for f in meta.get("files") or () if "/site-packages/" in f]
    return found


def modules(name):
    """NAME's top-level modules to import: the one named like it, else all (private and
    test ones left out while others remain); None when NAME is not installed here."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        found = conda_modules(name)
        if not found:
            return None
    else:
        top = dist.read_text("top_level.txt")
        found = top.split() if top else [module_of(str(f)) for f in dist.files or ()]
    found = sorted({m for m in found if m})
    public = [m for m in found if not m.startswith("_") and m.lower() not in NOT_MODULES]
    same = [m for m in public if canonical(m) == name]
    return same or public or found


def try_import(module):
    """None when MODULE imports, else its exception's own last line."""
    try:
        with contextlib.redirect_stdout(sys.stderr):   # stdout is the report's
            importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - any end of an import is its answer
        return traceback.format_exception_only(type(exc), exc)[-1].strip()
    return None


def check(names):
    imported: dict = {}
    failed: list = []
    absent: list = []
    for name in names:
        mods = modules(name)
        if mods is None:
            absent.append(name)
            continue
        for module in mods:
            error = try_import(module)
            if error is None:
                imported.setdefault(name, []).append(module)
            else:
                failed.append({"package": name, "module": module, "error": error})
    return {"imported": imported, "failed": failed, "not_installed": absent}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pip", action="append", default=[], metavar="LINE")
    parser.add_argument("--conda", action="append", default=[], metavar="LINE")
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    report = check(named(args.pip, args.conda))
    sys.stdout.flush()
    print(json.dumps(report, sort_keys=True))
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
