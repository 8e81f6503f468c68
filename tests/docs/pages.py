"""README.md and docs/*.md read as the tests need them: their headings, links and code blocks.

An example that a test runs is marked by an HTML comment on the line before its fence, which
a reader of the rendered page never sees:

    <!-- example: KIND -->                  run against the README's server (scripts/serve)
    <!-- example: KIND; serve: ARGS -->     ... started with ARGS added to its flags
    <!-- example: KIND; serve: none -->     needs no server
    <!-- example: not run (why) -->         read, never run

KIND is `transcript` (commands after `$ `, each followed by what it prints), `answers` (shell
lines whose every output is a JSON answer, never an error), `runs` (shell lines that exit 0)
or `python` (a script). Every block of README.md carries a marker; in docs/ they are optional.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
KINDS = ("transcript", "answers", "runs", "python")
NOT_RUN = "not run"

_MARKER = re.compile(r"^<!-- example: (?P<body>.*?) -->$")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\((?P<target>[^()\s]*(?:\([^()\s]*\))?)\)")
_CODE_SPAN = re.compile(r"(`+)(?P<code>.+?)\1")


@dataclass(frozen=True, slots=True)
class Block:
    """A fenced code block: where it is, its language, its marker's kind and server flags."""

    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    kind: str | None  # None: no marker
    serve: tuple[str, ...] | None  # flags added to the README's server; None: no server
    text: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _marker(line: str) -> tuple[str | None, tuple[str, ...] | None]:
    match = _MARKER.match(line.strip())
    if match is None:
        return None, ()
    kind, _, serve = match["body"].partition("; serve:")
    kind = kind.strip()
    if kind.startswith(NOT_RUN):
        return NOT_RUN, None
    flags = serve.split()
    return kind, None if flags == ["none"] else tuple(flags)


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            kind, serve = _marker(lines[i - 1]) if i else (None, ())
            out.append(Block(page, i + 1, lines[i][3:].strip(), kind, serve,
                             "\n".join(lines[i + 1:end]) + "\n"))
            i = end
        i += 1
    return out


def prose(page: Path) -> str:
    """The page without its fenced blocks (their lines left empty, so line numbers hold)."""
    lines, inside = page.read_text().splitlines(), False
    for i, line in enumerate(lines):
        fence = line.startswith("```")
        lines[i] = "" if inside or fence else line
        inside ^= fence
    return "\n".join(lines)


def links(page: Path) -> list[str]:
    """Every link and image target of the page's prose (code spans are not links)."""
    text = _CODE_SPAN.sub("", prose(page))
    return [m["target"] for m in _LINK.finditer(text)]


def code_spans(page: Path) -> list[str]:
    return [m["code"].strip() for m in _CODE_SPAN.finditer(prose(page))]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in prose(page).splitlines():
        if match := re.match(r"^#{1,6} (.+)$", line):
            base = slug(match[1])
            n = seen.get(base, 0)
            seen[base] = n + 1
    return {base if i == 0 else f"{base}-{i}" for base, n in seen.items() for i in range(n)}
