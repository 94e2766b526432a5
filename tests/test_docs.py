"""The documentation: every relative link lands on a file and, for a Markdown file,
on a heading; the anchor rule is GitHub's."""

from __future__ import annotations

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
