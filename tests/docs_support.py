"""Reading the project's Markdown as GitHub renders it: the links a page makes and
the anchors its headings get, so tests can check that every link lands."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target ends at whitespace or ")"
_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@dataclass(frozen=True)
class Link:
    """One link of a Markdown file: where it points, and on which line it is."""

    source: Path
    line: int
    target: str

    @property
    def is_relative(self) -> bool:
        return not _EXTERNAL.match(self.target)


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """Lines outside fenced code blocks, numbered from 1, with code spans blanked."""
    lines = []
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)))
    return lines


def links(path: Path) -> list[Link]:
    """Every link in the file's prose (links inside code are text, not links)."""
    return [
        Link(path, number, match.group(1))
        for number, line in _prose_lines(path.read_text())
        for match in _LINK.finditer(line)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings; a repeated heading gets -1, -2, ..."""
    seen: dict[str, int] = {}
    result = set()
    fenced = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def broken(link: Link) -> str | None:
    """Why a relative link does not land (no such file, or no such heading), else None."""
    path_part, _, anchor = link.target.partition("#")
    target = (link.source.parent / path_part).resolve() if path_part else link.source
    where = f"{_shown(link.source)}:{link.line}: {link.target}"
    if not target.exists():
        return f"{where}: no file {path_part}"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"{where}: no heading with the anchor #{anchor} in {_shown(target)}"
    return None


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
