"""Where the files that ship with clustertrain lie: the one place that knows.

site.yml, playbooks/, roles/, the collection's plugins (collections/), ansible.cfg,
environment.yml, the sandbox's containers.conf and group_vars, and the example job
train/. In a git checkout (and an editable install) they are the repository's own files,
in the parent directory of this package. An installed wheel carries copies of them in
this package's `_project/` directory, put there by the build (setup.py's build_py) from
the same files: the repository keeps one copy.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .errors import ClusterError

PACKAGE_DIR = Path(__file__).resolve().parent
# The wheel's copy of the shipped files, inside the package (setup.py writes it).
SHIPPED_DIR = "_project"


class ResourcesMissing(ClusterError):
    """Neither a checkout nor the installed package holds the shipped files."""


@dataclass(frozen=True)
class Project:
    """The shipped files, under ROOT (a checkout's root or the wheel's copy)."""

    root: Path

    @property
    def ansible_cfg(self) -> Path:
        return self.root / "ansible.cfg"

    @property
    def roles(self) -> Path:
        return self.root / "roles"

    @property
    def collection(self) -> Path:
        """The collection clustertrain.cluster as ansible.cfg's collections_path finds it
        (in a checkout, links to the repository's plugins/; in the wheel, copies)."""
        return self.root / "collections" / "ansible_collections" / "clustertrain" / "cluster"

    @property
    def containers_conf(self) -> Path:
        return self.root / "sandbox" / "containers.conf"

    def plugin(self, kind: str, name: str) -> ModuleType:
        """The collection's plugins/KIND/NAME.py (a filter, a module_utils) as a module: the
        roles' own rules, read by the orchestrator from the one file that holds them."""
        return _load(self.collection / "plugins" / kind / f"{name}.py",
                     f"clustertrain_cluster_{kind}_{name}")

    @property
    def sandbox_vars(self) -> Path:
        """Variables that describe what sandbox nodes are, merged into sandbox inventories."""
        return self.root / "sandbox" / "group_vars" / "all.yml"

    @property
    def fingerprint_py(self) -> Path:
        return self.root / "roles" / "python_env" / "files" / "fingerprint.py"

    @property
    def train(self) -> Path:
        """The example training job (train's default --workdir)."""
        return self.root / "train"

    def playbook(self, name: str) -> Path:
        """A playbook given relative to the root (site.yml, playbooks/nfs.yml)."""
        return (self.root / name).resolve()


def locate(package_dir: Path = PACKAGE_DIR) -> Project:
    """The shipped files for the package in PACKAGE_DIR: the wheel's copy when there is
    one, else the checkout the package sits in."""
    for root in (package_dir / SHIPPED_DIR, package_dir.parent):
        if (root / "site.yml").is_file() and (root / "roles").is_dir():
            return Project(root)
    raise ResourcesMissing(
        f"clustertrain's playbooks and roles are neither in {package_dir / SHIPPED_DIR} "
        f"(an installed wheel) nor in {package_dir.parent} (a git checkout); reinstall "
        "it with `pip install .` from a checkout, or from its wheel")


@functools.cache
def _load(path: Path, module_name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def project() -> Project:
    """The shipped files of the running package."""
    return locate()
