"""Drift between the nodes' environments, for playbooks/verify.yml.

The comparison and its words are roles/python_env/files/fingerprint.py's, the same file
the orchestrator's preflight uses, so both print the same message for the same drift.
"""

from __future__ import annotations

import importlib.util
import os

FINGERPRINT_PY = os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir,
                              os.pardir, "roles", "python_env", "files", "fingerprint.py")


def _fingerprint():
    spec = importlib.util.spec_from_file_location("clustertrain_fingerprint", FINGERPRINT_PY)
    assert spec is not None and spec.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fingerprint = _fingerprint()


def python_env_drift(live, provisioned, inventory):
    """{lines, realign, message, command}: what differs between the nodes' live
    fingerprints (LIVE, {node: fingerprint}) and since provisioning (PROVISIONED,
    {node: fingerprint or None}); the nodes to provision again; the message; the command
    that re-aligns them ("" when none), whose -i argument(s) are INVENTORY."""
    live = {str(node): fp for node, fp in (live or {}).items()}
    provisioned = {str(node): fp for node, fp in (provisioned or {}).items()}
    found = fingerprint.report(live, provisioned)
    command = fingerprint.realign_command(inventory, found["realign"]) if found["realign"] else ""
    return dict(found, message=fingerprint.message(found, inventory), command=command)


class FilterModule:
    def filters(self):
        return {"python_env_drift": python_env_drift}
