#!/usr/bin/python
"""The cluster environment's states on a node: make one current, remove old unused ones."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: python_env_states
short_description: Name the current state of the cluster's environment and prune old ones
description:
  - The python_env role realises each environment file (and wheelhouse lock) as a state of
    its own, C(ROOT/KEY). This module runs once the state C(current) is complete and
    C(python_env.json) names it.
  - Each of C(links) is made a symbolic link to its target (replaced atomically), so that
    the environment's usual path (C(/opt/clustertrain/venv)) names the current state. A
    real directory in a link's place (the layout before states) is removed first when no
    process runs from it, else left as it is (said in C(left)).
  - The states beyond the C(keep) newest (by when each was made) are removed, never the
    current one and never one a process runs from (its command line starts with the
    state's path, or it has a file of it mapped, a library of torch say); those are
    said in C(in_use) and removed by a later run.
  - Check mode supported.
options:
  root:
    description: The directory holding the states, one per key.
    type: path
    required: true
  current:
    description: The key (directory name) of the state that is now current.
    type: str
    required: true
  keep:
    description: How many states are kept at most (the current one among them).
    type: int
    default: 3
  links:
    description: Each C({path, target}); C(target) is made relative to C(path)'s directory.
    type: list
    elements: dict
    default: []
author: clustertrain
"""

RETURN = r"""
removed:
  description: The state directories removed (or, in check mode, that would be).
  type: list
  returned: always
in_use:
  description: Old states left because processes run from them, with those processes' ids.
  type: dict
  returned: always
left:
  description: Real directories left in a link's place because processes run from them.
  type: dict
  returned: always
"""

# Imports follow DOCUMENTATION and RETURN, as in every Ansible module.
import os  # noqa: E402
import shutil  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

MADE_MARK = "environment.yml"   # the first file the role writes into a state


def users_of(prefix, proc="/proc"):
    """Ids of the processes that run from PREFIX: it begins their command line (a venv's
    python is a link to the system's, so /proc/PID/exe cannot tell), or a file of it is
    mapped. Root sees every user's."""
    prefix = prefix.rstrip("/") + "/"
    found = []
    for pid in filter(str.isdigit, os.listdir(proc)):
        if int(pid) == os.getpid():
            continue
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as fh:
                argv = [a.decode(errors="replace") for a in fh.read().split(b"\0")[:2]]
            if any(a.startswith(prefix) for a in argv):
                found.append(int(pid))
                continue
            with open(os.path.join(proc, pid, "maps")) as fh:
                if any(prefix in line for line in fh):
                    found.append(int(pid))
        except OSError:
            continue   # ended meanwhile
    return sorted(found)


def states(root):
    """The state directories under ROOT, newest first (by when the role began each)."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    dirs = [os.path.join(root, n) for n in names
            if os.path.isdir(os.path.join(root, n)) and not os.path.islink(os.path.join(root, n))]

    def made(path):
        mark = os.path.join(path, MADE_MARK)
        return os.path.getmtime(mark if os.path.exists(mark) else path)
    return sorted(dirs, key=made, reverse=True)


def plan_prune(root, current, keep, using=users_of):
    """(to remove, in use): the states beyond the KEEP newest that no process runs from,
    and those left because some do."""
    old = [d for d in states(root) if os.path.basename(d) != current][max(keep - 1, 0):]
    remove, busy = [], {}
    for path in old:
        pids = using(os.path.realpath(path))
        if pids:
            busy[path] = pids
        else:
            remove.append(path)
    return remove, busy


def point(path, target, check, using=users_of):
    """Make PATH a link to TARGET (relative to PATH's directory). Returns (changed, left):
    LEFT is the ids of processes that run from a real directory found at PATH, then kept."""
    relative = os.path.relpath(target, os.path.dirname(path))
    if os.path.islink(path) and os.readlink(path) == relative:
        return False, []
    if os.path.isdir(path) and not os.path.islink(path):
        pids = using(os.path.realpath(path))
        if pids:
            return False, pids
        if not check:
            shutil.rmtree(path)
    if not check:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = "%s.tmp-%d" % (path, os.getpid())
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(relative, tmp)
        os.replace(tmp, path)   # atomic: a reader sees the old link or the new one
    return True, []


def main():
    module = AnsibleModule(
        argument_spec=dict(root=dict(type="path", required=True),
                           current=dict(type="str", required=True),
                           keep=dict(type="int", default=3),
                           links=dict(type="list", elements="dict", default=[])),
        supports_check_mode=True)
    p = module.params
    if p["keep"] < 1:
        module.fail_json(msg="python_env_keep is %d: keep at least the current state (1 or "
                         "more)" % p["keep"])
    if not os.path.isdir(os.path.join(p["root"], p["current"])):
        if module.check_mode:   # the role would have made it
            module.exit_json(changed=True, removed=[], in_use={}, left={})
        module.fail_json(msg="the current state %s does not exist"
                         % os.path.join(p["root"], p["current"]))
    changed, left = False, {}
    for link in p["links"]:
        moved, pids = point(link["path"], link["target"], module.check_mode)
        changed = changed or moved
        if pids:
            left[link["path"]] = pids
    remove, busy = plan_prune(p["root"], p["current"], p["keep"])
    if not module.check_mode:
        for path in remove:
            shutil.rmtree(path)
    module.exit_json(changed=changed or bool(remove), removed=remove, in_use=busy, left=left)


if __name__ == "__main__":
    main()
