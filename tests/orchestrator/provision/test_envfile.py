"""An environment file's entries checked on the controller (orchestrator/provision/envfile.py):
its conda lines by conda's match-spec form, its python pin and its pip lines by `packaging`,
each refused naming the file, the line, the entry and the fix, before any node is touched;
by `env create` and `wheelhouse` alike, through the real command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.provision.envfile import read_environment
from tests.clirun import run_cli

REPO = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "env.yml"
    path.write_text(text)
    return path


def refused_by_both(tmp_path: Path, capsys, path: Path, words: str) -> None:
    """`env create` and `wheelhouse` both refuse PATH with WORDS (exit 2), touching nothing:
    the inventory names a node nobody can reach, the wheelhouse is never made."""
    hosts = tmp_path / "hosts.ini"
    hosts.write_text("[train_nodes]\nnode0 ansible_host=192.0.2.1\n")
    for argv in (["env", "create", "-f", str(path), "-i", str(hosts)],
                 ["wheelhouse", "--env", str(path), "--dest", str(tmp_path / "wh")]):
        code, out = run_cli(argv, capsys)
        assert code == 2 and f"{path} line " in out and words in out, (argv, out)
        assert "Traceback" not in out
    assert not (tmp_path / "wh").exists()


@pytest.mark.parametrize("dep, words", [
    ("python=banana", "line 4: dependencies[1] 'python=banana': 'banana' is not a Python "
                      "version; pin it as python=3.11 (or python=3.11.9)"),
    ("python>=3.x", "'3.x' is not a Python version"),
    ("numpy=banana", "line 4: dependencies[1] 'numpy=banana' is not a conda package spec"),
    ("numpy==>1", "'numpy==>1' is not a conda package spec"),
    ("pytorch::>=2", "'pytorch::>=2' is not a conda package spec"),
])
def test_a_bad_conda_line_is_refused_on_the_controller(tmp_path: Path, capsys, dep: str,
                                                       words: str) -> None:
    path = write(tmp_path, f"name: x\ndependencies:\n  - pip\n  - {dep}\n  - pip: [tqdm]\n")
    refused_by_both(tmp_path, capsys, path, words)


@pytest.mark.parametrize("line, words", [
    ("numpy>>=1.0 ; ;", "line 6: dependencies[1].pip[1] 'numpy>>=1.0 ; ;' is not a pip "
                        "requirement ("),
    ("numpy=1.26", "'numpy=1.26' is not a pip requirement"),
    ("git+https://example.org/x.git", "is not a pip requirement"),
])
def test_a_malformed_pip_line_is_refused_on_the_controller(tmp_path: Path, capsys, line: str,
                                                           words: str) -> None:
    path = write(tmp_path, "name: x\ndependencies:\n  - python=3.11\n  - pip:\n"
                 f"    - tqdm\n    - '{line}'\n")
    refused_by_both(tmp_path, capsys, path, words)
    code, out = run_cli(["wheelhouse", "--env", str(path), "--dest", str(tmp_path / "w")],
                        capsys)
    assert "write NAME[extras][version][; marker]" in out, out
    if line == "numpy=1.26":
        assert "pip pins a version with ==: numpy==1.26" in out, out
    if line.startswith("git+"):
        assert "NAME @ URL" in out, out


@pytest.mark.parametrize("deps, words", [
    ("  - pip:\n    - numpy==1.26\n    - tqdm\n    - NumPy==2.0\n",
     "line 7: dependencies[1].pip[2] 'NumPy==2.0' names numpy again (line 5: 'numpy==1.26')"
     "; keep one of them"),
    ("  - numpy=1.26\n  - numpy=2.0\n",
     "line 5: dependencies[2] 'numpy=2.0' names numpy again (line 4: 'numpy=1.26')"),
])
def test_one_package_named_twice_is_refused(tmp_path: Path, capsys, deps: str,
                                            words: str) -> None:
    path = write(tmp_path, f"name: x\ndependencies:\n  - python=3.11\n{deps}")
    refused_by_both(tmp_path, capsys, path, words)


def test_an_environment_without_packages_is_refused(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "name: x\ndependencies: []\n")
    refused_by_both(tmp_path, capsys, path, f"{path} line 2: dependencies lists no package; "
                    "name the environment's packages (e.g. - python=3.11, - pip: [numpy])")


def test_the_forms_conda_and_pip_take_are_read(tmp_path: Path) -> None:
    """conda's match specs (channel::, =, ==, ranges, a build, a space) and PEP 508 lines
    with extras and markers, one package twice under two markers, pip's own options."""
    conda = ["python 3.11.*", "pip", "numpy=1.26", "pytorch::pytorch>=2,<3",
             "nvidia/label/cuda-12.1.0::cuda-toolkit", "scipy=1.11.4=py311h64a7726_0",
             "pandas >=2.1", "tzdata=2023c", "libblas=*=*mkl", "openssl 3.0.* h4ab18f5_3"]
    pip = ["--extra-index-url https://download.pytorch.org/whl/cu128", "torch==2.13.0",
           "requests[socks]>=2.31", "tqdm", "x @ https://example.org/x-1.0.tar.gz",
           "numpy==1.26; python_version<'3.12'", "numpy==2.0; python_version>='3.12'"]
    text = "name: x\ndependencies:\n" + "".join(f"  - {c}\n" for c in conda) + \
        "  - pip:\n" + "".join(f"    - \"{p}\"\n" for p in pip)
    found = read_environment(write(tmp_path, text), "env.yml", "an environment file")
    assert found.conda == tuple(conda) and found.pip == tuple(pip)
    assert found.pip_names == ("torch", "requests", "tqdm", "x", "numpy")
    assert found.conda_names == ("numpy", "pytorch", "cuda-toolkit", "scipy", "pandas",
                                 "tzdata", "libblas", "openssl")
    project = read_environment(REPO / "environment.yml", "environment.yml", "a file")
    assert "torch" in project.pip_names and project.conda_names == ()


@pytest.mark.parametrize("value", ["3.11.x", "banana", "3", "3.11rc1", "311"])
def test_a_python_version_that_is_none_is_refused_before_pip(tmp_path: Path, capsys,
                                                             value: str) -> None:
    path = write(tmp_path, "name: x\ndependencies:\n  - pip:\n    - tqdm\n")
    code, out = run_cli(["wheelhouse", "--env", str(path), "--dest", str(tmp_path / "wh"),
                         "--python-version", value], capsys)
    assert code == 2, out
    assert (f"--python-version: {value!r} is not a Python version; give the nodes' Python "
            "as X.Y or X.Y.Z, e.g. 3.11") in out, out
    assert not (tmp_path / "wh").exists()
