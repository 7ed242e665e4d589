"""The firewall keeps the runs' own ports open between cluster members, and only to them,
also when `firewall_cluster_allow_all` is false: the supervisors' beats (UDP,
`cluster_ring_ports`) and the rendezvous ports (TCP, `cluster_rendezvous_port_span` ports
from `cluster_rendezvous_port`), which a second run at the same time moves up in.

The role's nftables template is rendered with its defaults, worked out from roles/contract's
values as Ansible would, and the rendered input chain is read as nftables reads it: which
packet (source a member or not, protocol, port) would be accepted. Pure unit tests (Jinja2,
the collection's filters, no Ansible run); `nft -c` checks the syntax where nft can run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule as AnsibleFilters
from ansible.plugins.test.core import TestModule as AnsibleTests

from orchestrator import contract as orchestrator_contract

from .sources import REPO, load

ROLE = REPO / "roles" / "firewall"
CONTRACT = yaml.safe_load((REPO / "roles" / "contract" / "defaults" / "main.yml").read_text())
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())

net = load("plugins/filter/firewall_net.py", "firewall_net")
members = load("plugins/filter/cluster_members.py", "cluster_members")

MEMBERS = ["10.89.0.10", "10.89.0.11", "fd00:89::12"]
MEMBER = {4: "10.89.0.11", 6: "fd00:89::12"}
OUTSIDER = {4: "10.89.0.99", 6: "fd00:89::99"}


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROLE / "templates")),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             trim_blocks=True)  # as Ansible's template module
    env.filters.update(AnsibleFilters().filters())
    env.tests.update(AnsibleTests().tests())
    # The role calls the collection's filters by FQCN, as clustertrain.cluster has them.
    env.filters.update({f"clustertrain.cluster.{name}": f for module in (net, members)
                        for name, f in module.FilterModule().filters().items()})
    return env


def firewall_variables(env: jinja2.Environment, **site) -> dict:
    """The role's variables as a play sees them: the contract's defaults, overridden by the
    inventory's SITE values, and the firewall's defaults worked out from them."""
    variables = {**CONTRACT, **site, "ansible_managed": "managed"}
    for name, value in DEFAULTS.items():
        if isinstance(value, str) and value.strip().startswith("{{"):
            value = env.compile_expression(value.strip()[2:-2])(**variables)
        variables.setdefault(name, value)
    return variables


def render(allow_all: bool, **site) -> str:
    env = _environment()
    variables = firewall_variables(env, **site)
    variables.update(firewall_cluster_allow_all=allow_all, firewall_member_addresses=MEMBERS,
                     firewall_ssh_sources=["192.0.2.0/24"], firewall_controller_address="",
                     groups={"cluster": ["node0", "node1", "node2"]})
    return env.get_template("clustertrain.nft.j2").render(**variables)


# --- the rendered chain, read as nftables reads it -------------------------------------

@dataclass(frozen=True)
class Rule:
    """One `accept` rule of the input chain: from a set of addresses (None: anyone), for
    some protocols, to some ports (None: any)."""

    family: int | None              # 4 (ip saddr), 6 (ip6 saddr), None (no source match)
    source_set: str | None          # e.g. "cluster_v4"
    protocols: frozenset[str]
    ports: tuple[tuple[int, int], ...] | None

    def accepts(self, family: int, sets: set[str], protocol: str, port: int) -> bool:
        if self.family is not None and (self.family != family or self.source_set not in sets):
            return False
        if protocol not in self.protocols:
            return False
        return self.ports is None or any(low <= port <= high for low, high in self.ports)


SOURCE = re.compile(r"^(ip|ip6) saddr @(\w+) ")
PORTS = re.compile(r"^(tcp|udp) dport (\{[^}]*\}|[0-9-]+) accept$")
ANY_PORT = re.compile(r"^meta l4proto \{ ([a-z, ]+) \} accept$")


def _ports(text: str) -> tuple[tuple[int, int], ...]:
    spans = []
    for item in text.strip("{} ").split(","):
        low, _, high = item.strip().partition("-")
        spans.append((int(low), int(high or low)))
    return tuple(spans)


def rules(ruleset: str) -> list[Rule]:
    """The TCP/UDP accept rules of the input chain (ct state, loopback, ICMP left out)."""
    found = []
    for line in (raw.strip() for raw in ruleset.splitlines()):
        source = SOURCE.match(line)
        family, source_set = (4 if source[1] == "ip" else 6, source[2]) if source else (None, None)
        rest = line[source.end():] if source else line
        if match := PORTS.match(rest):
            found.append(Rule(family, source_set, frozenset({match[1]}), _ports(match[2])))
        elif match := ANY_PORT.match(rest):
            protocols = frozenset(p.strip() for p in match[1].split(","))
            found.append(Rule(family, source_set, protocols, None))
    return found


def accepted(ruleset: str, family: int, member: bool, protocol: str, port: int) -> bool:
    """Whether the input chain accepts a new connection (or datagram) from a member (else an
    outsider) of this IP family to PORT. The source sets: the member's, and for SSH the
    admin networks, which these tests keep apart from the members and the outsider."""
    sets = {f"cluster_v{family}"} if member else set()
    return any(rule.accepts(family, sets, protocol, port) for rule in rules(ruleset))


def ring_range() -> tuple[int, int]:
    low, high = str(CONTRACT["cluster_ring_ports"]).split("-")
    return int(low), int(high)


def rendezvous_range() -> tuple[int, int]:
    low = int(CONTRACT["cluster_rendezvous_port"])
    return low, low + int(CONTRACT["cluster_rendezvous_port_span"]) - 1


# --- the tests ---------------------------------------------------------------------------

def test_the_contract_declares_the_ring_and_rendezvous_ports_next_to_each_other():
    assert ring_range() == (29700, 29899)
    assert rendezvous_range() == (29500, 29699)
    # the firewall's defaults are the contract's values, written nowhere else
    assert DEFAULTS["firewall_ring_ports"] == "{{ cluster_ring_ports }}"
    assert DEFAULTS["firewall_rendezvous_port_span"] == "{{ cluster_rendezvous_port_span }}"


@pytest.mark.parametrize("family", [4, 6])
def test_a_closed_cluster_keeps_every_ring_port_open_to_members_only(family):
    """Before: with allow_all false the beats were dropped, and every run lost its peers."""
    ruleset = render(allow_all=False)
    low, high = ring_range()
    for port in (low, low + 1, (low + high) // 2, high):
        assert accepted(ruleset, family, True, "udp", port), (port, ruleset)
        assert not accepted(ruleset, family, False, "udp", port), (port, ruleset)
    # only the range: the ports around it stay closed, also to members
    assert not accepted(ruleset, family, True, "udp", low - 1), ruleset
    assert not accepted(ruleset, family, True, "udp", high + 1), ruleset
    # and it is UDP only
    assert not accepted(ruleset, family, True, "tcp", low), ruleset


@pytest.mark.parametrize("family", [4, 6])
def test_a_closed_cluster_keeps_every_rendezvous_port_open_to_members_only(family):
    """Before: only cluster_rendezvous_port was open, so the second run at the same time
    (whose master port is the next free one) could not rendezvous."""
    ruleset = render(allow_all=False)
    low, high = rendezvous_range()
    for port in (low, low + 1, high):
        assert accepted(ruleset, family, True, "tcp", port), (port, ruleset)
        assert not accepted(ruleset, family, False, "tcp", port), (port, ruleset)
    assert not accepted(ruleset, family, True, "tcp", high + 1), ruleset
    assert not accepted(ruleset, family, True, "udp", low), ruleset


@pytest.mark.parametrize("family", [4, 6])
def test_an_open_cluster_still_opens_everything_to_members_and_nothing_to_others(family):
    ruleset = render(allow_all=True)
    for protocol, port in (("udp", 29750), ("tcp", 29600), ("tcp", 41234), ("udp", 50000)):
        assert accepted(ruleset, family, True, protocol, port), (protocol, port)
        assert not accepted(ruleset, family, False, protocol, port), (protocol, port)


def test_the_sites_values_are_the_ones_opened():
    """An inventory's cluster_ring_ports and rendezvous values reach the rules."""
    ruleset = render(allow_all=False, cluster_ring_ports="31000-31009",
                     cluster_rendezvous_port=30000, cluster_rendezvous_port_span=5)
    assert accepted(ruleset, 4, True, "udp", 31009)
    assert not accepted(ruleset, 4, True, "udp", 29750)
    assert accepted(ruleset, 4, True, "tcp", 30004)
    assert not accepted(ruleset, 4, True, "tcp", 30005)
    assert not accepted(ruleset, 4, True, "tcp", 29500)


def test_a_range_of_one_port_is_written_as_that_port():
    ruleset = render(allow_all=False, cluster_ring_ports="29700-29700",
                     cluster_rendezvous_port_span=1)
    assert "udp dport 29700 accept" in ruleset
    assert "tcp dport 29500 accept" in ruleset
    assert accepted(ruleset, 4, True, "udp", 29700)
    assert not accepted(ruleset, 4, True, "tcp", 29501)


@pytest.mark.parametrize("allow_all", [False, True])
def test_the_rendered_ruleset_is_valid_nftables(tmp_path: Path, allow_all: bool):
    nft = shutil.which("nft")
    if nft is None:
        pytest.skip("nft is not installed here (molecule's firewall scenario loads it)")
    path = tmp_path / "clustertrain.nft"
    path.write_text(render(allow_all=allow_all))
    proc = subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True,
                          timeout=30)
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip("nft -c needs CAP_NET_ADMIN here")
    assert proc.returncode == 0, proc.stderr


# --- one port-range rule for the firewall and the orchestrator ------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("29700-29899", (29700, 29899)), ("29700 - 29899", "write it LOW-HIGH"),
    ("1024-1024", (1024, 1024)), ("65000-65535", (65000, 65535)),
    ("29899-29700", "unprivileged ports"), ("80-90", "unprivileged ports"),
    ("29700-70000", "unprivileged ports"), ("29700", "write it LOW-HIGH"),
    ("29700-x", "write it LOW-HIGH"), ("", "write it LOW-HIGH")])
def test_one_port_range_rule_for_the_roles_and_the_orchestrator(text, expected):
    rule = orchestrator_contract.rules().port_range
    if isinstance(expected, tuple):
        assert rule(text) == expected
        assert net.firewall_port_range_problem(text) == ""
        low, high = expected
        assert net.firewall_port_range(text) == (str(low) if low == high else f"{low}-{high}")
    else:
        with pytest.raises(ValueError, match=expected):
            rule(text)
        problem = net.firewall_port_range_problem(text)
        assert expected in problem and repr(text) in problem, problem
