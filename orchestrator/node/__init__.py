"""Everything that runs on a node, as one standard-library package: shipped to each node
once per version (orchestrator/cluster/nodelib.py) and called by verb (__main__.py).
Its modules import only the standard library and each other; the controller imports its
rules from here too, so that both ends read one copy (protocol.py, fault.py, queuelimits.py,
cordon.py, ...); the doctor's measurements import torch when they run, in the job's
environment.

Four of its modules are files of the roles, which also install them on the nodes for root
(the health check's timer, Slurm's drain helper, the environment's fingerprint): the
roles' files are the one source (ROLE_MODULES). The package's search path reaches them
where the roles lie beside it (a checkout, or the wheel's copy of the project), so that
`from orchestrator.node import health` imports roles/health/files/health.py; nodelib's
bundle carries them to the nodes as files of the package itself.
"""

from __future__ import annotations

import os

# module -> the role whose files/ holds it
ROLE_MODULES = {"health": "health", "cordon": "slurm", "untrusted": "slurm",
                "fingerprint": "python_env"}
# Where the roles lie, from this directory: a checkout's (or an editable install's) root,
# and the wheel's copy (orchestrator/_project/: resources.SHIPPED_DIR).
_ROLES = ((os.pardir, os.pardir, "roles"), (os.pardir, "_project", "roles"))


def role_module_files(package_dir: str = os.path.dirname(os.path.abspath(__file__))
                      ) -> dict[str, str]:
    """{module: its file} of ROLE_MODULES beside PACKAGE_DIR; {} where no roles lie (on a
    node, whose copy of the package holds them)."""
    for roles in _ROLES:
        found = {name: os.path.normpath(os.path.join(package_dir, *roles, role, "files",
                                                     f"{name}.py"))
                 for name, role in ROLE_MODULES.items()}
        if all(os.path.isfile(path) for path in found.values()):
            return found
    return {}


__path__.extend(sorted({os.path.dirname(path) for path in role_module_files().values()}))
