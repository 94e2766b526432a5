"""The documentation: every relative link lands on a file and, for a Markdown file,
on a heading; the anchor rule is GitHub's."""

from __future__ import annotations

import re
from pathlib import Path

from docs_support import ROOT, Link, anchors, broken, links, slug

DOCS = ROOT / "docs"


def markdown_files() -> list[Path]:
    """The README, docs/ and the Markdown shipped next to the code and the deployment."""
    found = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    for folder in ("controller", "deploy", "benchmarks", "proto"):
        found += sorted((ROOT / folder).rglob("*.md"))
    return found


def test_every_relative_link_lands() -> None:
    relative = [link for path in markdown_files() for link in links(path) if link.is_relative]
    assert len(relative) > 20, "the documentation links fewer pages than it should"
    problems = [problem for link in relative if (problem := broken(link))]
    assert problems == []


def test_anchors_follow_github() -> None:
    assert slug("`specctl replay`") == "specctl-replay"
    assert slug("SpecctlAcceptanceDrop") == "specctlacceptancedrop"
    assert (
        slug("The real engine as the arbiter: `specctl bench --engine vllm`")
        == "the-real-engine-as-the-arbiter-specctl-bench---engine-vllm"
    )
    assert slug("Engine safety: where specctl's scheduler differs") == (
        "engine-safety-where-specctls-scheduler-differs"
    )


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n## Twice\n\n## Twice\n\n"
        "[fine](#twice-1) [gone](missing.md) [no heading](page.md#nowhere)\n\n"
        "```\n[in code](missing.md)\n```\n`[in a code span](missing.md)`\n"
    )
    assert anchors(page) == {"a-page", "twice", "twice-1"}
    found = links(page)
    assert [link.target for link in found] == ["#twice-1", "missing.md", "page.md#nowhere"]
    assert [broken(link) is None for link in found] == [True, False, False]
    assert not Link(page, 1, "https://example.com/x.md").is_relative


README = ROOT / "README.md"
README_MAX_LINES = 300


def _section(text: str, heading: str) -> str:
    """The body of a '## ' section, up to the next '## ' heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_the_readme_is_a_front_door() -> None:
    assert len(README.read_text().splitlines()) <= README_MAX_LINES


def test_the_readme_map_lists_every_folder_of_the_package() -> None:
    """One line per folder of controller/ (a package: it has an __init__.py), no more."""
    described = _section(README.read_text(), "The map of the code")
    listed = set(re.findall(r"^- `controller/(\w+)/`", described, re.MULTILINE))
    folders = {p.parent.name for p in (ROOT / "controller").glob("*/__init__.py")}
    assert listed == folders
    for folder in ("proto", "deploy", "tests", "benchmarks", "docs"):
        assert re.search(rf"^- `{folder}/`", described, re.MULTILINE), folder
        assert (ROOT / folder).is_dir(), folder


def test_the_readme_indexes_every_page_of_docs() -> None:
    index = _section(README.read_text(), "Documentation")
    listed = {link.target for link in links(README) if f"]({link.target})" in index}
    assert listed == {f"docs/{page.name}" for page in DOCS.glob("*.md")}
