"""The build step that puts the playbooks and roles into the package (see pyproject.toml).

The repository keeps one copy of site.yml, playbooks/, roles/... at its root, where
`ansible-playbook site.yml -i inventory` and molecule use them. A wheel needs them inside
the package: build_py copies them into orchestrator/_project/ of the build tree (never
into the repository), and sdist carries them so that a wheel built from the sdist gets
them too. orchestrator/resources.py finds them in either place.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

# Relative to the repository root: what the verbs read. Directories are copied whole,
# less caches; links are followed (collections/ reaches the roles' plugins through links,
# which a wheel cannot hold).
SHIPPED = ("site.yml", "ansible.cfg", "environment.yml", "playbooks", "roles", "collections",
           "sandbox/containers.conf", "sandbox/group_vars", "train")
TARGET = Path("orchestrator") / "_project"   # orchestrator.resources.SHIPPED_DIR
SKIPPED = {"__pycache__", ".pytest_cache", ".cache"}
ROOT = Path(__file__).resolve().parent


def shipped_files(root: Path) -> list[Path]:
    """Every file of SHIPPED under ROOT, relative to it."""
    found: list[Path] = []
    for entry in SHIPPED:
        path = root / entry
        if not path.exists():
            raise SystemExit(f"setup.py: {path} is missing; build from a complete checkout")
        if path.is_file():
            found.append(Path(entry))
            continue
        for top, dirs, files in os.walk(path, followlinks=True):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED)
            found += [Path(top, f).relative_to(root) for f in sorted(files)
                      if not f.endswith(".pyc")]
    return found


class BuildPyWithProject(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout itself
        # A fresh copy each build: nothing removed from the repository lingers in build/.
        shutil.rmtree(Path(self.build_lib) / TARGET, ignore_errors=True)
        for rel in shipped_files(ROOT):
            dest = Path(self.build_lib) / TARGET / rel
            self.mkpath(str(dest.parent))
            self.copy_file(str(ROOT / rel), str(dest))


class SdistWithProject(sdist):
    def add_defaults(self) -> None:
        super().add_defaults()
        self.filelist.extend(str(p) for p in shipped_files(ROOT))


setup(cmdclass={"build_py": BuildPyWithProject, "sdist": SdistWithProject})
