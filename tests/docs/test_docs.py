"""The documents a newcomer reads first: the README stays short, its links lead somewhere,
and the architecture page names the package's folders as they are."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_reads_in_five_minutes() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)


def test_every_link_of_the_readme_and_the_docs_leads_to_a_file() -> None:
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text()):
            if "://" in target:
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}"


def test_the_architecture_page_names_the_folders_as_they_are() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    folders = {p.name for p in (REPO / "orchestrator").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}
    named = set(re.findall(r"`orchestrator/(\w+)/`", text))
    assert named == folders, (folders - named, named - folders)
    for module in re.findall(r"`((?:cli|cluster|checks|record|run|diagnosis|report|workloads|ui"
                             r"|node|provision|sandbox)/\w+\.py)`", text):
        assert (REPO / "orchestrator" / module).exists(), module
