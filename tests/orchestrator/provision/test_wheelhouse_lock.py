"""The wheelhouse's lock: the sha256 of every wheel, the requirement lines with hashes the
python_env role installs with (pip --require-hashes), and a changed wheel refused by name.
No pip runs here: the wheelhouse is made of small files with a stamp saying it is current."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.provision.wheelhouse import (
    LOCK,
    STAMP,
    WheelhouseError,
    WheelhouseRequest,
    build,
    load_environment,
    name_version,
    read_lock,
    target_python,
)

FILES = {"torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl": b"torch wheel",
         "typing_extensions-4.16.0-py3-none-any.whl": b"typing wheel",
         "Jinja2-3.1.6.tar.gz": b"an sdist"}


def current_wheelhouse(tmp_path: Path) -> WheelhouseRequest:
    env = tmp_path / "environment.yml"
    env.write_text("name: t\ndependencies: [python=3.11, pip, {pip: [torch==2.13.0]}]\n")
    request = WheelhouseRequest(env, tmp_path / "wh")
    request.dest.mkdir()
    for name, content in FILES.items():
        (request.dest / name).write_bytes(content)
    spec = load_environment(env)
    key = target_python(request, spec).key(spec)   # as build keys it: for python 3.11
    (request.dest / STAMP).write_text(json.dumps({"key": key, "files": sorted(FILES)}))
    return request


def test_names_and_versions_from_file_names() -> None:
    assert name_version("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == (
        "torch", "2.13.0+cpu")
    assert name_version("typing_extensions-4.16.0-py3-none-any.whl") == (
        "typing-extensions", "4.16.0")
    assert name_version("Jinja2-3.1.6.tar.gz") == ("jinja2", "3.1.6")


def test_a_wheelhouse_gets_a_lock_with_every_sha256(tmp_path: Path) -> None:
    request = current_wheelhouse(tmp_path)
    result = build(request)
    assert result.up_to_date
    lock = read_lock(request.dest)
    sha = {n: hashlib.sha256(c).hexdigest() for n, c in FILES.items()}
    assert {w["file"]: w["sha256"] for w in lock["wheels"]} == sha
    assert lock["pip"] == ["torch==2.13.0"]
    assert lock["requirements"] == [
        f"jinja2==3.1.6 --hash=sha256:{sha['Jinja2-3.1.6.tar.gz']}",
        f"torch==2.13.0+cpu --hash=sha256:"
        f"{sha['torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl']}",
        f"typing-extensions==4.16.0 --hash=sha256:"
        f"{sha['typing_extensions-4.16.0-py3-none-any.whl']}"]
    written = (request.dest / LOCK).stat().st_mtime_ns
    assert build(request).up_to_date and (request.dest / LOCK).stat().st_mtime_ns == written


def test_a_wheel_changed_after_the_build_is_refused_by_name(tmp_path: Path) -> None:
    request = current_wheelhouse(tmp_path)
    build(request)
    name = "typing_extensions-4.16.0-py3-none-any.whl"
    (request.dest / name).write_bytes(b"something else")
    with pytest.raises(WheelhouseError) as err:
        build(request)
    message = str(err.value)
    assert f"{name}: expected sha256 {hashlib.sha256(FILES[name]).hexdigest()}, got " \
           f"{hashlib.sha256(b'something else').hexdigest()}" in message
    assert "delete it and run wheelhouse again" in message
