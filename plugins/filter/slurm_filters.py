"""The slurm role's node logic: what slurm.conf says of each node, and which nodes are
not ready yet, from facts and `sinfo` output (kept out of the templates' Jinja so that it
is tested on its own: tests/roles/test_slurm_filters.py)."""

from __future__ import annotations

import importlib.util
import os

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # the unit tests import this file without Ansible's plugin loader
    class AnsibleFilterError(Exception):  # type: ignore[no-redef]
        pass

# A node is up for Slurm in these states (sinfo's short names, without the flag
# suffixes * ~ # ! % $ @ ^ - that say "not responding", "powered off"...).
READY_STATES = ("idle", "alloc", "mix", "comp", "drain", "drng", "resv", "plnd")
# The share of a node's memory Slurm may hand out (slurmd refuses a node that has less
# than slurm.conf says, and the kernel reports a little less than the fact).
MEMORY_SHARE = 0.95


def _load_contract():
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), os.pardir,
                        "module_utils", "cluster_contract.py")
    spec = importlib.util.spec_from_file_location("clustertrain_cluster_contract", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


contract = _load_contract()


def slurm_nodes(hosts, hostvars):
    """[{name, hostname, address, cpus, memory_mb, gpus, gpu_files}] of the given hosts,
    from their facts: the inventory name is Slurm's NodeName (so that sinfo, squeue and
    the orchestrator name a node alike), the machine's host name its NodeHostname."""
    nodes = []
    missing = []
    for host in hosts or []:
        hv = hostvars[host] if host in hostvars else {}
        facts = hv.get("ansible_facts") or {}
        gpus = (facts.get("ansible_local") or {}).get("clustertrain_gpus")
        if not facts.get("processor_vcpus") or not facts.get("memtotal_mb") or gpus is None:
            missing.append(host)
            continue
        nodes.append({
            "name": host,
            "hostname": facts.get("hostname") or host,
            "address": contract.member_address(host, hv)[0],
            "cpus": int(facts["processor_vcpus"]),
            "memory_mb": max(1, int(int(facts["memtotal_mb"]) * MEMORY_SHARE)),
            "gpus": int(gpus.get("count", 0)),
            "gpu_files": list(gpus.get("files", [])),
        })
    if missing:
        raise AnsibleFilterError(
            f"no hardware or GPU facts for {', '.join(missing)}: the slurm role gathers them "
            "on every node of the cluster; run site.yml on the whole cluster once so that "
            "each node has its GPU fact (/etc/ansible/facts.d/clustertrain_gpus.fact)")
    return nodes


def _hostlist(files):
    return ",".join(files)


def slurm_conf_nodes(nodes):
    """slurm.conf's NodeName lines, one per node."""
    lines = []
    for n in nodes:
        gres = f" Gres=gpu:{n['gpus']}" if n["gpus"] else ""
        lines.append(f"NodeName={n['name']} NodeHostname={n['hostname']} "
                     f"NodeAddr={n['address']} CPUs={n['cpus']} "
                     f"RealMemory={n['memory_mb']}{gres} State=UNKNOWN")
    return lines


def slurm_gres_lines(nodes):
    """gres.conf's lines: each node's GPU device files (the same file on every node)."""
    return [f"NodeName={n['name']} Name=gpu File={_hostlist(n['gpu_files'])}"
            for n in nodes if n["gpus"]]


def slurm_not_ready(sinfo_lines, names):
    """The nodes of `names` that `sinfo -h -N -o '%N %t'` does not show in a ready state
    (absent, unknown, down, or not responding), each as 'name (state)'."""
    states = {}
    for line in sinfo_lines or []:
        parts = line.split()
        if len(parts) >= 2:
            states[parts[0]] = parts[1]
    out = []
    for name in names or []:
        state = states.get(name, "absent")
        if state.rstrip("*~#!%$@^-") != state or state not in READY_STATES:
            out.append(f"{name} ({state})")
    return out


def _shown(results):
    """{what: [row, ...]} from the registered loop of `sacctmgr -nP show WHAT format=...`
    (each row split at '|')."""
    return {r["item"]: [line.split("|") for line in r.get("stdout_lines") or []]
            for r in results or [] if "item" in r}


def slurm_accounting_changes(results, cluster, account, users, qos, max_gpus, limits=True):
    """The sacctmgr commands that bring accounting to what the inventory says, each
    {label, argv}: the cluster, the account, each user of `users` in it on this cluster,
    and the QOS with its per-user GPU limit (max_gpus; 0: none) and the DenyOnLimit flag
    (a job above one of its limits alone, which would wait for ever, is refused when it is
    submitted; `show qos format=name,maxtrespu,flags`). Nothing that is already
    there; users accounting has and the inventory does not are left alone. limits=False
    leaves the limit out: accounting knows the GPU TRES only once slurmctld has registered
    with AccountingStorageTRES=gres/gpu, and slurmctld needs the partition's QOS first."""
    shown = _shown(results)
    changes = []
    if cluster not in [row[0] for row in shown.get("cluster", [])]:
        changes.append({"label": f"cluster {cluster}",
                        "argv": ["sacctmgr", "-i", "add", "cluster", cluster]})
    if account not in [row[0] for row in shown.get("account", [])]:
        changes.append({"label": f"account {account}",
                        "argv": ["sacctmgr", "-i", "add", "account", account,
                                 f"Cluster={cluster}", "Description=clustertrain users",
                                 "Organization=clustertrain"]})
    have = {row[2] for row in shown.get("association", [])
            if len(row) >= 3 and row[0] == cluster and row[1] == account and row[2]}
    new = [u for u in users or [] if u not in have]
    if new:
        changes.append({"label": f"users {','.join(new)}",
                        "argv": ["sacctmgr", "-i", "add", "user", ",".join(new),
                                 f"Account={account}", f"Cluster={cluster}"]})
    rows = [row for row in shown.get("qos", []) if row and row[0] == qos]
    limit = f"gres/gpu={int(max_gpus)}" if int(max_gpus) > 0 else ""
    if not rows:
        changes.append({"label": f"qos {qos}", "argv": ["sacctmgr", "-i", "add", "qos", qos]})
    current = rows[0][1] if rows and len(rows[0]) > 1 else ""
    flags = rows[0][2].split(",") if rows and len(rows[0]) > 2 else []
    if "DenyOnLimit" not in flags:
        changes.append({"label": f"qos {qos} Flags+=DenyOnLimit",
                        "argv": ["sacctmgr", "-i", "modify", "qos", "where", f"name={qos}",
                                 "set", "Flags+=DenyOnLimit"]})
    if limits and current != limit:
        changes.append({"label": f"qos {qos} MaxTRESPerUser={limit or 'none'}",
                        "argv": ["sacctmgr", "-i", "modify", "qos", "where", f"name={qos}",
                                 "set", f"MaxTRESPerUser={limit or 'gres/gpu=-1'}"]})
    return changes


class FilterModule:
    def filters(self):
        return {
            "slurm_nodes": slurm_nodes,
            "slurm_conf_nodes": slurm_conf_nodes,
            "slurm_gres_lines": slurm_gres_lines,
            "slurm_not_ready": slurm_not_ready,
            "slurm_accounting_changes": slurm_accounting_changes,
        }
