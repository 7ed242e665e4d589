"""Filters of the nfs_server role: its client list, export options and directory tree,
computed here (and unit-tested in tests/roles) rather than in long Jinja."""

from __future__ import annotations

import ipaddress
import re

# nfs_server_squash -> (kernel exports(5) option, nfs-ganesha EXPORT Squash value): the two
# servers map client user IDs the same way for each choice.
SQUASH = {
    "root_squash": ("root_squash", "Root_Squash"),
    "no_root_squash": ("no_root_squash", "No_Root_Squash"),
    "all_squash": ("all_squash", "All_Squash"),
}
_MODE = re.compile(r"^0?[0-7]{3,4}$")
_SUBDIR = re.compile(r"^[^/]+(/[^/]+)*$")


def nfs_server_invalid_clients(specs):
    """Return the entries of ``specs`` that are neither an IP address nor a CIDR network.

    A CIDR with host bits set (``10.0.0.1/24``) counts as invalid: it is almost always a
    typo for the network or for one host, and the two mean very different exports.
    """
    bad = []
    for spec in specs or []:
        text = str(spec).strip()
        try:
            if "/" in text:
                ipaddress.ip_network(text, strict=True)
            else:
                ipaddress.ip_address(text)
        except ValueError:
            bad.append(spec)
    return bad


def _squash(squash):
    try:
        return SQUASH[squash]
    except (KeyError, TypeError):
        raise ValueError("nfs_server_squash must be one of %s, not %r"
                         % (", ".join(sorted(SQUASH)), squash)) from None


def nfs_server_export_options(squash, read_write=True, sync=True, anonuid=65534, anongid=65534,
                              secure=True):
    """The option list of the kernel export line (exports(5)), e.g.
    'rw,sync,secure,no_subtree_check,root_squash,anonuid=65534,anongid=65534'; `secure`
    (privileged source ports only) is the kernel's default, written out all the same."""
    return ",".join([
        "rw" if read_write else "ro",
        "sync" if sync else "async",
        "secure" if secure else "insecure",
        "no_subtree_check",
        _squash(squash)[0],
        "anonuid=%d" % int(anonuid),
        "anongid=%d" % int(anongid),
    ])


def nfs_server_ganesha_squash(squash):
    """nfs-ganesha's Squash value for nfs_server_squash (Root_Squash for root_squash)."""
    return _squash(squash)[1]


def nfs_server_user_directories(users, passwd, existing):
    """What the role does with each of USERS' checkpoints/<user>/, given the server's
    PASSWD (getent: name -> [password, uid, gid, ...]) and EXISTING (the paths that exist):
    {"make": [{name, uid, gid}], "unknown": [names]}; those that exist are left alone."""
    make, unknown = [], []
    for name in users or []:
        if name not in (passwd or {}):
            unknown.append(name)
        elif name not in (existing or []):
            entry = passwd[name]
            make.append({"name": name, "uid": int(entry[1]), "gid": int(entry[2])})
    return {"make": make, "unknown": unknown}


def nfs_server_subdirectory_problems(entries):
    """What is wrong with nfs_server_subdirectories, one message per bad entry."""
    problems = []
    for entry in entries or []:
        spec = entry if isinstance(entry, dict) else {"path": entry}
        path = spec.get("path")
        if not isinstance(path, str) or not _SUBDIR.match(path) or ".." in path.split("/"):
            problems.append("%r: path must be a relative path inside the export (e.g. data, "
                            "checkpoints)" % (entry,))
            continue
        mode = spec.get("mode")
        if mode is not None and not (isinstance(mode, str) and _MODE.match(mode)):
            problems.append("%s: mode must be an octal string in quotes such as \"1777\", not %r"
                            % (path, mode))
        unknown = sorted(set(spec) - {"path", "mode", "owner", "group"})
        if unknown:
            problems.append("%s: unknown keys %s (use path, mode, owner, group)"
                            % (path, ", ".join(unknown)))
    return problems


def nfs_server_subdirectory_specs(entries, owner="root", group="root", mode="0755"):
    """[{path, owner, group, mode}] for each entry of nfs_server_subdirectories: a plain
    string, or a dict whose missing keys come from the export root's owner, group, mode."""
    specs = []
    for entry in entries or []:
        spec = entry if isinstance(entry, dict) else {"path": entry}
        specs.append({
            "path": spec["path"],
            "owner": spec.get("owner") or owner,
            "group": spec.get("group") or group,
            "mode": spec.get("mode") or mode,
        })
    return specs


class FilterModule:
    """Ansible entry point."""

    def filters(self):
        return {
            "nfs_server_invalid_clients": nfs_server_invalid_clients,
            "nfs_server_export_options": nfs_server_export_options,
            "nfs_server_ganesha_squash": nfs_server_ganesha_squash,
            "nfs_server_subdirectory_problems": nfs_server_subdirectory_problems,
            "nfs_server_subdirectory_specs": nfs_server_subdirectory_specs,
            "nfs_server_user_directories": nfs_server_user_directories,
        }
