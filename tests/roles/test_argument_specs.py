"""Each role's variables are described in one place, its meta/argument_specs.yml.

Every variable of defaults/main.yml is there with a description and, where its value
is a plain one (not a template), with that value as `default`, so that
`ansible-doc -t role -r roles ROLE` (the command the READMEs point at) shows it; no
README repeats a variable table.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/meta/argument_specs.yml"))


def defaults(role: str) -> dict:
    return yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}


def options(role: str) -> dict:
    specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return specs["argument_specs"]["main"]["options"]


def templated(value: object) -> bool:
    return isinstance(value, str) and "{{" in value


def test_all_ten_roles_have_a_spec():
    assert len(ROLES) == 10, ROLES


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_described_in_the_spec_with_its_value(role):
    opts = options(role)
    for name, value in defaults(role).items():
        assert name in opts, f"{role}: {name} is in defaults/main.yml but not in argument_specs"
        assert opts[name].get("description"), f"{role}: {name} has no description"
        if opts[name].get("required"):
            continue  # a required option cannot have a default in the spec
        if templated(value):
            # computed at run time: the spec may name the fallback value only
            if "default" in opts[name]:
                assert str(opts[name]["default"]) in value, f"{role}: {name}"
        else:
            assert "default" in opts[name], f"{role}: {name} lacks default: {value!r}"
            assert opts[name]["default"] == value, \
                f"{role}: {name} spec default {opts[name]['default']!r} != {value!r}"


@pytest.mark.parametrize("role", ROLES)
def test_readme_points_at_the_spec_instead_of_a_variable_table(role):
    readme = (REPO / "roles" / role / "README.md").read_text()
    assert f"ansible-doc -t role -r roles {role}" in readme
    assert "meta/argument_specs.yml" in readme
    rows = [ln for ln in readme.splitlines() if re.match(rf"^\|\s*`{role}_\w+`", ln)]
    assert not rows, f"{role}/README.md repeats variables of the spec: {rows}"


@pytest.mark.slow
@pytest.mark.parametrize("role", ROLES)
def test_ansible_doc_shows_the_role_variables(role):
    """The command the READMEs give works and lists every variable with its default."""
    doc = Path(sys.executable).with_name("ansible-doc")
    proc = subprocess.run([str(doc), "-t", "role", "-r", "roles", "-j", role], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)[role]["entry_points"]["main"]["options"]
    for name, value in defaults(role).items():
        assert name in shown, f"ansible-doc does not show {name}"
        if not templated(value) and not shown[name].get("required"):
            assert shown[name]["default"] == value, name


# Keys whose value Ansible evaluates as a bare Jinja expression.
BARE_KEYS = {"when", "that", "changed_when", "failed_when", "until"}
JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.S)


def expressions(node: object, bare: bool = False):
    """Every Jinja expression in a role file's YAML: the bare ones (when, that, ...) and
    those inside {{ }} and {% %} of any other string."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from expressions(value, key in BARE_KEYS)
    elif isinstance(node, list):
        for value in node:
            yield from expressions(value, bare)
    elif isinstance(node, str):
        yield from [node] if bare else JINJA.findall(node)


def role_expressions(role: str):
    """(file, expression) for every task, handler, vars and defaults file and template."""
    base = REPO / "roles" / role
    for path in sorted(base.glob("*/*.yml")) + sorted(base.glob("*/*.yaml")):
        if path.parent.name in ("tasks", "handlers", "vars", "defaults"):
            for expr in expressions(yaml.safe_load(path.read_text())):
                yield path.relative_to(base), expr
    for path in sorted(base.glob("templates/**/*.j2")):
        for expr in JINJA.findall(path.read_text()):
            yield path.relative_to(base), expr


@pytest.mark.parametrize("role", ROLES)
def test_boolean_options_are_read_through_the_bool_filter(role):
    """A boolean given on the command line (`-e nvidia_driver_persistenced=false`) reaches
    the role as the string "false", which Jinja takes for true; the argument spec checks
    it but does not convert it. So every use of a bool option goes through `| bool`."""
    booleans = [name for name, spec in options(role).items() if spec.get("type") == "bool"]
    bare = [f"{path}: {name} in {expr.strip()[:90]!r}"
            for path, expr in role_expressions(role) for name in booleans
            if re.search(rf"\b{name}\b(?!\s*\|\s*bool)", expr)]
    assert not bare, f"{role}: bool options read without | bool:\n" + "\n".join(bare)
