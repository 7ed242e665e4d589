"""roles/python_env/files/fingerprint.py: the environment read from its files (no torch
import), GPUs and driver without torch, and the drift comparison preflight and verify.yml
share.

GPU test doubles (this machine has no GPU): fixtures/nvidia/proc-driver-nvidia-8xh100 is a
/proc/driver/nvidia tree of an 8-GPU H100 node in the driver's format (version file of the
open kernel module 570.133.20, one gpus/<bus id>/ directory per GPU with its information,
power and registry files), and a stand-in `nvidia-smi` script prints recorded `nvidia-smi -L`
output (fixtures/nvidia/nvidia-smi-L-*.txt, one with MIG devices).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from .sources import REPO, load

SCRIPT = REPO / "roles" / "python_env" / "files" / "fingerprint.py"
NVIDIA = Path(__file__).resolve().parent / "fixtures" / "nvidia"


fp = load("roles/python_env/files/fingerprint.py", "fingerprint_under_test")


def fake_nvidia_smi(tmp_path: Path, listing: str) -> str:
    """A named test double for nvidia-smi: prints a recorded `nvidia-smi -L`."""
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] && exec cat {NVIDIA / listing}\n"
                   "[ \"$1\" = --query-gpu=driver_version ] && echo 570.133.20\n")
    exe.chmod(0o755)
    return str(exe)


# --- GPUs and driver, without torch ----------------------------------------------------

def test_gpus_counted_from_a_recorded_proc_tree() -> None:
    count, source = fp.gpu_count(proc_root=str(NVIDIA / "proc-driver-nvidia-8xh100"),
                                 smi="/nonexistent/nvidia-smi")
    assert count == 8 and source.endswith("/gpus")


def test_driver_version_from_the_recorded_proc_file() -> None:
    assert fp.driver_version(sys_root="/nonexistent",
                             proc_root=str(NVIDIA / "proc-driver-nvidia-8xh100"),
                             smi="/nonexistent/nvidia-smi") == "570.133.20"


def test_proprietary_module_version_line(tmp_path: Path) -> None:
    (tmp_path / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 "
        "UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    assert fp.driver_version(sys_root="/nonexistent", proc_root=str(tmp_path)) == "535.183.01"


def test_without_proc_nvidia_smi_counts_gpus_not_mig_devices(tmp_path: Path) -> None:
    smi = fake_nvidia_smi(tmp_path, "nvidia-smi-L-8xh100.txt")
    assert fp.gpu_count(proc_root=str(tmp_path / "none"), smi=smi) == (8, "nvidia-smi -L")
    smi = fake_nvidia_smi(tmp_path, "nvidia-smi-L-mig.txt")
    assert fp.gpu_count(proc_root=str(tmp_path / "none"), smi=smi) == (2, "nvidia-smi -L")
    assert fp.driver_version(sys_root="/nonexistent", proc_root=str(tmp_path / "none"),
                             smi=smi) == "570.133.20"


def test_no_driver_no_gpus(tmp_path: Path) -> None:
    assert fp.gpu_count(proc_root=str(tmp_path), smi="/nonexistent/nvidia-smi") == (0, None)
    assert fp.driver_version(sys_root=str(tmp_path), proc_root=str(tmp_path),
                             smi="/nonexistent/nvidia-smi") is None


# --- the environment from its metadata ---------------------------------------------------

def _dist(site: Path, name: str, version: str, kind: str = "dist-info") -> None:
    d = site / f"{name.replace('-', '_')}-{version}.{kind}"
    d.mkdir(parents=True)
    meta = "METADATA" if kind == "dist-info" else "PKG-INFO"
    (d / meta).write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                          "Summary: x\n\nName: not-this\nVersion: 0\n")


def cuda_venv(root: Path) -> Path:
    """The files a venv with a CUDA build of torch holds (what is read; nothing runs)."""
    site = root / "lib" / "python3.11" / "site-packages"
    _dist(site, "torch", "2.13.0+cu128")
    _dist(site, "nvidia-nccl-cu12", "2.27.3")
    _dist(site, "nvidia-cuda-runtime-cu12", "12.8.90")
    _dist(site, "Typing_Extensions", "4.16.0")
    _dist(site, "legacy.pkg", "1.0", kind="egg-info")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.13.0+cu128'\ndebug = False\n"
        "cuda: Optional[str] = '12.8'\ngit_version = 'abc'\nhip: Optional[str] = None\n")
    (root / "bin").mkdir()
    os.symlink(sys.executable, root / "bin" / "python")
    return root


def test_a_cuda_venv_is_read_without_importing_anything(tmp_path: Path) -> None:
    env = cuda_venv(tmp_path / "venv")
    lock = tmp_path / "lock.json"
    lock.write_text("{}")
    f = fp.fingerprint(str(env), str(env / "bin" / "python"), str(lock))
    assert f["packages"] == {"legacy-pkg": "1.0", "nvidia-cuda-runtime-cu12": "12.8.90",
                             "nvidia-nccl-cu12": "2.27.3", "torch": "2.13.0+cu128",
                             "typing-extensions": "4.16.0"}
    assert (f["torch"], f["cuda"], f["nccl"]) == ("2.13.0+cu128", "12.8", "2.27.3")
    assert f["python"] == ".".join(map(str, sys.version_info[:3]))
    assert f["lock"] == fp.file_sha256(str(lock)) and "conda" not in f
    assert len(f["sha256"]) == 64 and fp.seal(f)["sha256"] == f["sha256"]


def test_a_conda_environment_lists_conda_meta(tmp_path: Path) -> None:
    env = tmp_path / "envs" / "clustertrain"
    (env / "conda-meta").mkdir(parents=True)
    for name in ("python-3.11.9-h955ad1f_0", "pytorch-2.5.1-py3.11_cuda12.4_cudnn9.1.0_0",
                 "nccl-2.21.5.1-h3a97aeb_0", "cuda-cudart-12.4.127-h99ab3db_0", "history"):
        (env / "conda-meta" / f"{name}.json").write_text("{}")
    f = fp.fingerprint(str(env), str(env / "bin" / "python"))
    assert f["conda"]["pytorch"] == "2.5.1=py3.11_cuda12.4_cudnn9.1.0_0"
    assert (f["python"], f["torch"], f["nccl"], f["cuda"]) == ("3.11.9", "2.5.1", "2.21.5.1",
                                                               "12.4.127")


def test_metadata_scan_agrees_with_importlib_metadata() -> None:
    """On this machine's own virtualenv: the same distributions and versions."""
    site = sysconfig.get_paths()["purelib"]
    expected: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=[site]):
        expected.setdefault(fp.canonical(dist.metadata["Name"]), dist.version)
    assert fp.packages([site]) == dict(sorted(expected.items()))


def test_cli_with_python_env_json_and_against_the_provisioned_one(tmp_path: Path) -> None:
    env = cuda_venv(tmp_path / "venv")
    info = tmp_path / "python_env.json"
    info.write_text(json.dumps({"prefix": str(env), "python": str(env / "bin" / "python")}))
    run = [sys.executable, str(SCRIPT), "--env", str(info)]
    first = json.loads(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
    (tmp_path / "fingerprint.json").write_text(json.dumps(first))
    _dist(env / "lib" / "python3.11" / "site-packages", "numpy", "2.1.0")
    again = json.loads(subprocess.run(run + ["--against", str(tmp_path / "fingerprint.json")],
                                      capture_output=True, text=True, check=True).stdout)
    assert again["changes"] == ["package numpy: absent when provisioned, 2.1.0 now"]


# --- drift: the words preflight and verify.yml print -----------------------------------

def _fp(**packages) -> dict:
    return fp.seal({"python": "3.11.2", "packages": dict(packages), "torch": "2.13.0",
                    "cuda": None, "nccl": None, "driver": None, "lock": "ab"})


def test_drift_names_package_nodes_and_both_versions() -> None:
    live = {"node0": _fp(fsspec="2026.9.0", torch="2.13.0"),
            "node1": _fp(fsspec="2026.9.0", torch="2.13.0"),
            "node2": _fp(torch="2.13.0", mpmath="1.4.0")}
    provisioned = {"node0": live["node0"], "node1": live["node1"], "node2": live["node0"]}
    out = fp.report(live, provisioned)
    assert out["lines"] == [
        "package fsspec: node0=2026.9.0, node1=2026.9.0, node2=absent",
        "package mpmath: node0=absent, node1=absent, node2=1.4.0",
        "node2 since provisioning: package fsspec: 2026.9.0 when provisioned, absent now",
        "node2 since provisioning: package mpmath: absent when provisioned, 1.4.0 now"]
    assert out["realign"] == ["node2"]


def test_nodes_provisioned_differently_realign_the_minority() -> None:
    a, b = _fp(numpy="2.1.0"), _fp(numpy="2.2.0")
    live = {"node0": a, "node1": b, "node2": a}
    out = fp.report(live, dict(live))
    assert out["lines"] == ["package numpy: node0=2.1.0, node1=2.2.0, node2=2.1.0"]
    assert out["realign"] == ["node1"]


def test_a_field_missing_from_an_older_fingerprint_is_not_drift() -> None:
    old = {k: v for k, v in _fp(torch="2.13.0").items() if k != "lock"}
    assert fp.changes(old, _fp(torch="2.13.0")) == []
    assert fp.report({"node0": _fp(torch="2.13.0")}, {"node0": old})["lines"] == []


def test_cli_drift_mode() -> None:
    data = {"live": {"node0": _fp(x="1"), "node1": _fp(x="2")}}
    p = subprocess.run([sys.executable, str(SCRIPT), "--drift"], input=json.dumps(data),
                       capture_output=True, text=True, check=True)
    assert json.loads(p.stdout) == {"lines": ["package x: node0=1, node1=2"],
                                    "realign": ["node1"]}


@pytest.mark.parametrize("version, cuda", [("2.13.0+cu128", "12.8"), ("2.9.0+cu130", "13.0"),
                                           ("2.13.0+cpu", None)])
def test_cuda_from_torch_version_suffix_when_version_py_is_missing(tmp_path, version, cuda):
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    _dist(site, "torch", version)
    assert fp.fingerprint(str(tmp_path), sys.executable)["cuda"] == cuda
