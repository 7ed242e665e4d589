"""Root squashing and the ownership of the share (nfs_server role): the defaults, the
filters behind the kernel export line and ganesha.conf, and both templates rendered with
the role's defaults. Pure unit tests (Jinja2 and the role's filter module, no Ansible run).
"""

from __future__ import annotations

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import to_bool

from .sources import REPO, load

ROLE = REPO / "roles" / "nfs_server"

filters = load("plugins/filter/nfs_server_filters.py", "nfs_server_filters")

DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
OPTIONS = SPECS["argument_specs"]["main"]["options"]


def render(template: str, **overrides) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROLE / "templates")),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    # The role calls its filters by FQCN, as the collection clustertrain.cluster has them.
    env.filters.update({f"clustertrain.cluster.{name}": f
                        for name, f in filters.FilterModule().filters().items()})
    env.filters["bool"] = to_bool   # Ansible's own `bool` filter
    variables = {k: v for k, v in DEFAULTS.items() if not str(v).startswith("{{")}
    variables.update(ansible_managed="managed", nfs_server_export_path="/srv/nfs/cluster",
                     nfs_server_clients=["10.89.0.10", "10.89.0.11"], **overrides)
    return env.get_template(template).render(**variables)


def test_root_is_squashed_by_default_and_documented_so():
    assert DEFAULTS["nfs_server_squash"] == "root_squash"
    assert OPTIONS["nfs_server_squash"]["default"] == "root_squash"
    assert DEFAULTS["nfs_server_anonymous_uid"] == 65534
    assert DEFAULTS["nfs_server_anonymous_gid"] == 65534
    readme = (ROLE / "README.md").read_text()
    # The README's variable table is gone (the spec above is the one place for variables);
    # its prose still states the default.
    assert "squashes root by default (`nfs_server_squash: root_squash`" in readme


def test_kernel_export_and_ganesha_squash_root_with_the_defaults():
    exports = [line for line in render("exports.j2").splitlines()
               if line and not line.startswith("#")]
    options = "rw,sync,secure,no_subtree_check,root_squash,anonuid=65534,anongid=65534"
    assert exports == [f"/srv/nfs/cluster 10.89.0.10({options}) 10.89.0.11({options})"]

    ganesha = render("ganesha.conf.j2")
    assert "Squash = Root_Squash;" in ganesha
    assert "Anonymous_Uid = 65534;" in ganesha
    assert "Anonymous_Gid = 65534;" in ganesha
    assert "No_Root_Squash" not in ganesha


@pytest.mark.parametrize(("squash", "kernel", "ganesha"), [
    ("root_squash", "root_squash", "Root_Squash"),
    ("no_root_squash", "no_root_squash", "No_Root_Squash"),
    ("all_squash", "all_squash", "All_Squash"),
])
def test_both_servers_map_user_ids_the_same_way(squash, kernel, ganesha):
    assert filters.nfs_server_export_options(squash).split(",")[4] == kernel
    assert filters.nfs_server_ganesha_squash(squash) == ganesha
    assert f"Squash = {ganesha};" in render("ganesha.conf.j2", nfs_server_squash=squash)
    assert set(OPTIONS["nfs_server_squash"]["choices"]) == set(filters.SQUASH)


def test_export_options_follow_the_other_settings():
    assert filters.nfs_server_export_options("root_squash", False, False, 1500, 1600) == \
        "ro,async,secure,no_subtree_check,root_squash,anonuid=1500,anongid=1600"
    assert ",insecure," in filters.nfs_server_export_options("root_squash", secure=False)
    with pytest.raises(ValueError, match="nfs_server_squash"):
        filters.nfs_server_export_options("squash_everything")


def test_data_is_roots_and_checkpoints_and_cordons_are_sticky_and_world_writable():
    specs = filters.nfs_server_subdirectory_specs(
        DEFAULTS["nfs_server_subdirectories"], DEFAULTS["nfs_server_export_owner"],
        DEFAULTS["nfs_server_export_group"], DEFAULTS["nfs_server_export_mode"])
    assert specs == [
        {"path": "data", "owner": "root", "group": "root", "mode": "0755"},
        {"path": "checkpoints", "owner": "root", "group": "root", "mode": "1777"},
        {"path": "cordons", "owner": "root", "group": "root", "mode": "1777"},
    ]
    assert filters.nfs_server_subdirectory_problems(DEFAULTS["nfs_server_subdirectories"]) == []


def test_plain_subdirectory_names_still_work():
    assert filters.nfs_server_subdirectory_specs(["scratch"], "root", "train", "0775") == [
        {"path": "scratch", "owner": "root", "group": "train", "mode": "0775"}]


@pytest.mark.parametrize(("entry", "words"), [
    ({"path": "checkpoints", "mode": 1777}, ["checkpoints", "in quotes", "1777"]),
    ({"path": "checkpoints", "mode": "rwx"}, ["checkpoints", "rwx"]),
    ({"path": "../etc"}, ["relative path inside the export"]),
    ("/abs", ["relative path inside the export"]),
    ({"path": "data", "perms": "0755"}, ["unknown keys perms"]),
])
def test_bad_subdirectories_are_named(entry, words):
    problems = filters.nfs_server_subdirectory_problems([entry])
    assert len(problems) == 1
    for word in words:
        assert word in problems[0], problems


def test_a_boolean_given_as_a_string_on_the_command_line_is_read_as_meant():
    """`-e nfs_server_read_write=false` reaches the templates as the string "false",
    which a bare `if` would take for true."""
    assert "Access_Type = RO;" in render("ganesha.conf.j2", nfs_server_read_write="false")
    assert "Access_Type = RW;" in render("ganesha.conf.j2", nfs_server_read_write="true")


def test_both_servers_take_requests_from_privileged_ports_only_by_default():
    """With sec=sys the server believes the uid a request states: only root on a client may
    open a privileged source port, so a user without root cannot state another's uid."""
    assert DEFAULTS["nfs_server_secure"] is True
    assert OPTIONS["nfs_server_secure"]["default"] is True
    exports = [line for line in render("exports.j2").splitlines() if line][-1]
    assert exports.count("(rw,sync,secure,") == 2 and "insecure" not in exports
    ganesha = render("ganesha.conf.j2")
    assert "PrivilegedPort = true;" in ganesha and "SecType = sys;" in ganesha
    assert "PrivilegedPort = false;" in render("ganesha.conf.j2", nfs_server_secure="false")
    assert "(rw,sync,insecure," in render("exports.j2", nfs_server_secure=False)


def test_each_users_checkpoints_directory_is_made_theirs_unless_it_exists_or_is_unknown():
    passwd = {"alice": ["x", "1001", "1001", "", "/home/alice", "/bin/bash"],
              "bob": ["x", "1002", "1002", "", "/home/bob", "/bin/bash"]}
    assert filters.nfs_server_user_directories(["alice", "bob", "carol"], passwd, ["bob"]) == {
        "make": [{"name": "alice", "uid": 1001, "gid": 1001}], "unknown": ["carol"]}
    assert filters.nfs_server_user_directories([], {}, []) == {"make": [], "unknown": []}
    assert DEFAULTS["nfs_server_user_directories"] == "{{ cluster_users }}"
