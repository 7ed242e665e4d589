"""Fingerprint of a Python environment, read from its files (clustertrain).

The one implementation used by the python_env role (at provisioning, and to notice drift
before repairing it), by playbooks/verify.yml, and by the orchestrator's preflight probe,
which runs it on every node at every launch with the node's system python. So it uses the
standard library only and imports nothing from the environment: the installed
distributions and their versions come from the environment's metadata (`*.dist-info`,
`*.egg-info` in site-packages, and `conda-meta/` in a conda environment), torch's CUDA
version from torch/version.py, the NCCL and CUDA runtime versions from the packages that
ship them (nvidia-*-cu* wheels, conda's nccl), the driver from /proc/driver/nvidia/version.

    fingerprint.py [--env python_env.json | --prefix DIR [--python EXE] [--lock FILE]]
                   [--against fingerprint.json] [--checks]
    fingerprint.py --drift < {"live": {"node": fingerprint, ...}, "provisioned": {...}}

prints one JSON object: {"python", "packages", ["conda",] "torch", "cuda", "nccl",
"driver", "lock", "sha256"}; the sha256 is over the canonical JSON (sorted keys, no
spaces) of the other fields, so two nodes with the same stack have the same hash.
Without --env/--prefix the environment is the one of the running interpreter.
--against FILE adds "changes": what differs from the fingerprint in FILE (the one written
at provisioning). --checks also imports torch (run it with the environment's python) and
adds "checks": torch imports, torch.distributed, CUDA, GPUs torch sees, GPUs the node has.
--drift compares the nodes (stdin: {"live": {node: fingerprint}, "provisioned": {...}}):
{"lines": [...], "realign": [nodes to provision again]}.
"""

import ast
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys

# Scalar fields compared between nodes; "packages" and "conda" are compared per package.
FIELDS = ("python", "torch", "cuda", "nccl", "driver", "lock")
SECTIONS = (("packages", "package"), ("conda", "conda package"))
# What pip itself is made of in a venv: installed with the venv, not from any lock.
BOOTSTRAP = ("pip",)


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _headers(path):
    """Name and Version from a METADATA / PKG-INFO file (headers end at the first blank
    line; the long description after it is not read)."""
    name = version = None
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if not line.strip():
                break
            if name is None and line.startswith("Name:"):
                name = line[5:].strip()
            elif version is None and line.startswith("Version:"):
                version = line[8:].strip()
            if name and version:
                break
    return name, version


def site_packages(prefix):
    """The environment's site-packages directories (venv and conda layouts)."""
    found, seen = [], set()
    for pattern in ("lib/python3*/site-packages", "lib64/python3*/site-packages",
                    "lib/site-packages"):
        for path in sorted(glob.glob(os.path.join(prefix, pattern))):
            real = os.path.realpath(path)
            if real not in seen and os.path.isdir(path):
                seen.add(real)
                found.append(path)
    return found


def packages(dirs):
    """{canonical name: version} of every distribution installed in DIRS, as
    importlib.metadata would list them (the first one found wins)."""
    found: dict[str, str] = {}
    for directory in dirs:
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            continue
        for entry in entries:
            path = os.path.join(directory, entry)
            if entry.endswith(".dist-info"):
                meta = os.path.join(path, "METADATA")
            elif entry.endswith(".egg-info"):
                meta = os.path.join(path, "PKG-INFO") if os.path.isdir(path) else path
            else:
                continue
            try:
                name, version = _headers(meta)
            except OSError:
                continue
            if name:
                found.setdefault(canonical(name), version)
    return dict(sorted(found.items()))


def conda_packages(prefix):
    """{name: "version=build"} from conda-meta/ (file names are name-version-build.json,
    where only the name may contain '-'); None when PREFIX is not a conda environment."""
    meta = os.path.join(prefix, "conda-meta")
    try:
        entries = os.listdir(meta)
    except OSError:
        return None
    found = {}
    for entry in entries:
        if not entry.endswith(".json"):
            continue
        parts = entry[:-5].rsplit("-", 2)
        if len(parts) == 3:
            found[parts[0]] = f"{parts[1]}={parts[2]}"
    return dict(sorted(found.items()))


def torch_build(dirs):
    """Values of torch/version.py (__version__, cuda, hip) without importing torch."""
    for directory in dirs:
        path = os.path.join(directory, "torch", "version.py")
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError:
            continue
        values = {}
        for match in re.finditer(r"^(__version__|cuda|hip)\s*(?::[^=\n]*)?=\s*(.+?)\s*$",
                                 text, re.M):
            try:
                values[match.group(1)] = ast.literal_eval(match.group(2))
            except (ValueError, SyntaxError):
                pass
        return values
    return {}


def _first(pkgs, pattern):
    for name, version in (pkgs or {}).items():
        if re.fullmatch(pattern, name):
            return version
    return None


def driver_version(sys_root="/sys/module/nvidia", proc_root="/proc/driver/nvidia",
                   smi="nvidia-smi"):
    """The loaded NVIDIA kernel module's version; nvidia-smi only where /proc says
    nothing and it is installed; None without an NVIDIA driver."""
    try:
        with open(os.path.join(sys_root, "version")) as fh:
            return fh.read().strip() or None
    except OSError:
        pass
    try:
        with open(os.path.join(proc_root, "version")) as fh:
            match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", fh.read())
            return match.group(1) if match else None
    except OSError:
        pass
    exe = shutil.which(smi)
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.strip().splitlines()
    return lines[0] if lines else None


def gpu_count(proc_root="/proc/driver/nvidia", smi="nvidia-smi"):
    """(GPUs the driver exposes to this node, where that was read), without torch:
    /proc/driver/nvidia/gpus/<bus id>/information, else `nvidia-smi -L`."""
    gpus = os.path.join(proc_root, "gpus")
    try:
        entries = os.listdir(gpus)
    except OSError:
        entries = None
    if entries is not None:
        return sum(os.path.isfile(os.path.join(gpus, e, "information")) for e in entries), gpus
    exe = shutil.which(smi)
    if not exe:
        return 0, None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0, None
    return len(re.findall(r"^GPU \d+:", out, re.M)), "nvidia-smi -L"


def pci_gpus(root="/sys/bus/pci/devices"):
    count = 0
    for dev in glob.glob(root + "/*"):
        try:
            with open(dev + "/vendor") as v, open(dev + "/class") as c:
                if v.read().strip() == "0x10de" and c.read().strip().startswith("0x03"):
                    count += 1
        except OSError:
            continue
    return count


def python_version(prefix, python, conda):
    """The environment's python version: conda-meta's python, the running interpreter
    when the environment's python is the same file (a venv of it), else asked."""
    if conda and "python" in conda:
        return conda["python"].split("=")[0]
    if python and os.path.realpath(python) == os.path.realpath(sys.executable):
        return platform.python_version()
    python = python or os.path.join(prefix, "bin", "python")
    try:
        p = subprocess.run([python, "-I", "-S", "-c",
                            "import platform; print(platform.python_version())"],
                           capture_output=True, text=True, timeout=30)
        return p.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def file_sha256(path):
    if not path:
        return None
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def fingerprint(prefix, python=None, lock=None):
    """The environment at PREFIX as it is now (reads files only)."""
    dirs = site_packages(prefix)
    pkgs = packages(dirs)
    conda = conda_packages(prefix)
    build = torch_build(dirs)
    torch = pkgs.get("torch") or build.get("__version__") or (
        conda["pytorch"].split("=")[0] if conda and "pytorch" in conda else None)
    cuda = build.get("cuda")
    match = re.search(r"\+cu(\d+)(\d)$", torch) if not cuda and torch else None
    if match:
        major, minor = match.groups()
        cuda = f"{major}.{minor}"
    cuda = cuda or _first(pkgs, r"nvidia-cuda-runtime(-cu\d+)?") or (
        _first(conda, r"cuda-cudart|cudatoolkit") or "").split("=")[0] or None
    nccl = _first(pkgs, r"nvidia-nccl(-cu\d+)?") or (
        _first(conda, r"nccl") or "").split("=")[0] or None
    fp = {"python": python_version(prefix, python, conda), "packages": pkgs,
          "torch": torch, "cuda": cuda, "nccl": nccl, "driver": driver_version(),
          "lock": file_sha256(lock)}
    if conda is not None:
        fp["conda"] = conda
    return seal(fp)


def seal(fp):
    fp = {k: v for k, v in fp.items() if k not in ("sha256", "changes", "checks")}
    blob = json.dumps(fp, sort_keys=True, separators=(",", ":"))
    fp["sha256"] = hashlib.sha256(blob.encode()).hexdigest()
    return fp


def _show(value):
    return "none" if value is None else str(value)


def drift(fps):
    """Lines naming each package or field that differs between nodes, with each node's
    value: "package fsspec: node0=2026.9.0, node1=absent". FPS: {node: fingerprint}."""
    nodes = [n for n, fp in fps.items() if fp]
    if len(nodes) < 2:
        return []
    lines = []
    for section, label in SECTIONS:
        if not all(section in fps[n] for n in nodes):
            continue
        names = sorted({p for n in nodes for p in (fps[n].get(section) or {})})
        for pkg in names:
            versions = [(n, (fps[n].get(section) or {}).get(pkg)) for n in nodes]
            if len({v for _, v in versions}) > 1:
                lines.append(f"{label} {pkg}: " + ", ".join(
                    f"{n}={v or 'absent'}" for n, v in versions))
    for key in FIELDS:
        if not all(key in fps[n] for n in nodes):
            continue  # a fingerprint from before this field existed
        values = [(n, fps[n].get(key)) for n in nodes]
        if len({_show(v) for _, v in values}) > 1:
            lines.append(f"{key}: " + ", ".join(f"{n}={_show(v)}" for n, v in values))
    if not lines and len({fps[n].get("sha256") for n in nodes}) > 1:
        lines.append("sha256 differs: " + ", ".join(
            f"{n}={str(fps[n].get('sha256'))[:12]}" for n in nodes))
    return lines


def changes(provisioned, live):
    """Lines naming what differs on one node between the fingerprint written at
    provisioning and the live one: "package fsspec: 2026.9.0 when provisioned, absent
    now". Fields the provisioned fingerprint does not have (older format) are skipped."""
    if not provisioned or not live:
        return []
    lines = []
    for section, label in SECTIONS:
        if section not in provisioned or section not in live:
            continue
        was, now = provisioned.get(section) or {}, live.get(section) or {}
        for pkg in sorted(set(was) | set(now)):
            if was.get(pkg) != now.get(pkg):
                lines.append(f"{label} {pkg}: {was.get(pkg) or 'absent'} when provisioned, "
                             f"{now.get(pkg) or 'absent'} now")
    for key in FIELDS:
        if key in provisioned and key in live and \
                _show(provisioned.get(key)) != _show(live.get(key)):
            lines.append(f"{key}: {_show(provisioned.get(key))} when provisioned, "
                         f"{_show(live.get(key))} now")
    return lines


def realign(fps, provisioned=None):
    """The nodes to provision again: those whose environment changed since provisioning;
    else, when nodes differ, those outside the largest group of equal fingerprints (ties:
    the group of the first node stays)."""
    provisioned = provisioned or {}
    changed = [n for n, fp in fps.items() if fp and changes(provisioned.get(n), fp)]
    if changed or not drift(fps):
        return changed
    groups: dict[str, list[str]] = {}
    for n, fp in fps.items():
        if fp:
            groups.setdefault(fp.get("sha256"), []).append(n)
    keep = max(groups.values(), key=len)
    first = next(iter(groups.values()))
    if len(first) == len(keep):
        keep = first
    return [n for n, fp in fps.items() if fp and n not in keep]


def report(live, provisioned=None):
    """Everything that is drift, in the words preflight and verify.yml both print: the
    differences between nodes, then each node's changes since provisioning; and the nodes
    to provision again (`ansible-playbook site.yml --limit ...`)."""
    provisioned = provisioned or {}
    lines = drift(live)
    for node, fp in live.items():
        lines += ["%s since provisioning: %s" % (node, line)
                  for line in changes(provisioned.get(node), fp)]
    nodes = realign(live, provisioned) if lines else []
    return {"lines": lines, "realign": nodes or ([n for n, fp in live.items() if fp]
                                                  if lines else [])}


def realign_command(inventory, nodes):
    """The command that provisions NODES again; INVENTORY is what follows -i."""
    return "ansible-playbook site.yml -i %s --limit %s" % (inventory, ",".join(nodes))


def message(found, inventory):
    """The drift that report() FOUND, in the words preflight and verify.yml both print
    ("" when there is none); INVENTORY as in realign_command."""
    if not found["lines"]:
        return ""
    return ("environment drift (read from each node's environment now):\n    "
            + "\n    ".join(found["lines"])
            + "\n  re-align %s: %s" % (", ".join(found["realign"]),
                                       realign_command(inventory, found["realign"])))


def checks():
    """Import torch in this interpreter: what works (for verify.yml and preflight)."""
    import warnings

    result = {"torch_import": None, "distributed": False, "nccl": False,
              "cuda_available": False, "gpu_count": 0, "pci_gpus": pci_gpus(),
              "driver_gpus": gpu_count()[0], "version": None}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
    except Exception as exc:  # any import failure is reported, not raised
        result["torch_import"] = "%s: %s" % (type(exc).__name__, exc)
        return result
    result["torch_import"] = "ok"
    result["version"] = torch.__version__
    result["distributed"] = bool(torch.distributed.is_available())
    if result["distributed"]:
        result["nccl"] = bool(torch.distributed.is_nccl_available())
    result["cuda_available"] = bool(torch.cuda.is_available())
    result["gpu_count"] = torch.cuda.device_count() if result["cuda_available"] else 0
    return result


def _arg(argv, name):
    if name in argv and argv.index(name) + 1 < len(argv):
        return argv[argv.index(name) + 1]
    return None


def main(argv):
    if "--drift" in argv:
        data = json.load(sys.stdin)
        if "live" not in data:
            data = {"live": data}
        print(json.dumps(report(data["live"], data.get("provisioned"))))
        return 0
    env = {}
    if _arg(argv, "--env"):
        with open(_arg(argv, "--env")) as fh:
            env = json.load(fh)
    prefix = _arg(argv, "--prefix") or env.get("prefix") or sys.prefix
    python = _arg(argv, "--python") or env.get("python") or (
        sys.executable if prefix == sys.prefix else None)
    fp = fingerprint(prefix, python, _arg(argv, "--lock") or env.get("lock"))
    if _arg(argv, "--against"):
        try:
            with open(_arg(argv, "--against")) as fh:
                fp["changes"] = changes(json.load(fh), fp)
        except (OSError, ValueError) as exc:
            fp["changes"] = ["no fingerprint from provisioning to compare with (%s)" % exc]
    if "--checks" in argv:
        fp["checks"] = checks()
    print(json.dumps(fp, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
