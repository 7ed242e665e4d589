"""Fingerprint of the Python environment this interpreter runs in (clustertrain).

Run with the environment's own python. Prints one JSON object:
  {"python", "packages", "torch", "cuda", "nccl", "driver", "sha256"}
with --checks also "checks": whether torch imports, torch.distributed is available,
CUDA works, how many GPUs torch sees and how many NVIDIA GPUs the PCI bus holds.
The sha256 is over the canonical JSON (sorted keys, no spaces) of the other fields,
so two nodes with the same stack have the same hash.
"""

import glob
import hashlib
import importlib.metadata
import json
import platform
import re
import sys
import warnings


def _canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def packages():
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[_canonical(name)] = dist.version
    return dict(sorted(found.items()))


def driver_version():
    try:
        with open("/sys/module/nvidia/version") as fh:
            return fh.read().strip() or None
    except OSError:
        pass
    try:
        with open("/proc/driver/nvidia/version") as fh:
            match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]+)", fh.read())
            return match.group(1) if match else None
    except OSError:
        return None


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


def main(argv):
    checks = {"torch_import": None, "distributed": False, "cuda_available": False,
              "gpu_count": 0, "pci_gpus": pci_gpus()}
    fp = {"python": platform.python_version(), "packages": packages(), "torch": None,
          "cuda": None, "nccl": None, "driver": driver_version()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
    except Exception as exc:  # any import failure is reported, not raised
        checks["torch_import"] = "%s: %s" % (type(exc).__name__, exc)
    else:
        fp["torch"] = torch.__version__
        fp["cuda"] = torch.version.cuda
        try:
            fp["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
        except Exception:  # CPU build: no NCCL compiled in
            fp["nccl"] = None
        checks["torch_import"] = "ok"
        checks["distributed"] = bool(torch.distributed.is_available())
        checks["cuda_available"] = bool(torch.cuda.is_available())
        checks["gpu_count"] = torch.cuda.device_count() if checks["cuda_available"] else 0
    blob = json.dumps(fp, sort_keys=True, separators=(",", ":"))
    fp["sha256"] = hashlib.sha256(blob.encode()).hexdigest()
    if "--checks" in argv:
        fp["checks"] = checks
    print(json.dumps(fp, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
