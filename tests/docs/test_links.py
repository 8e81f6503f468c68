"""Every page's links lead somewhere in this repository, and nothing points outside it: a
clone holds everything the documentation names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.pages import PAGES, ROOT, anchors, blocks, code_spans, links

PAGE_IDS = [str(p.relative_to(ROOT)) for p in PAGES]
TOP = {p.name for p in ROOT.iterdir()} - {".git", ".venv"}
REPO_PATH = re.compile(r"^(?:\.\./)*[\w.-]+(?:/[\w.-]+)+/?$")


def problems_of(page: Path, target: str) -> list[str]:
    """What is wrong with a link from `page` to `target` (nothing for a web address)."""
    if re.match(r"^https?://", target):
        return []
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
        return [f"{target}: not a relative link into the repository"]
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    if not file.is_relative_to(ROOT):
        return [f"{target}: outside the repository"]
    if not file.exists():
        return [f"{target}: no such file"]
    if anchor and (file.suffix != ".md" or anchor not in anchors(file)):
        return [f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}"]
    return []


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    found = [p for target in links(page) for p in problems_of(page, target)]
    assert found == []


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_file_the_page_names_is_in_the_repository(page: Path) -> None:
    """A path in a code span (`api/errors.py`, `../examples/keys.toml`) is a file of the clone."""
    missing = []
    for span in code_spans(page):
        if not REPO_PATH.match(span):
            continue
        file = (page.parent / span).resolve() if span.startswith("..") else ROOT / span
        if span.startswith("..") and not file.is_relative_to(ROOT):
            missing.append(f"{span}: outside the repository")
        elif (span.startswith("..") or span.split("/")[0] in TOP) and not file.exists():
            missing.append(f"{span}: no such file")
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_no_example_reaches_outside_the_repository(page: Path) -> None:
    escaping = [f"{b.name}: {line.strip()}" for b in blocks(page) for line in b.text.splitlines()
                if "../" in line or re.search(r"(?<![\w.])/(?:work|home|root|tmp)/", line)]
    assert escaping == []


def test_the_readme_links_every_page_of_the_docs() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    assert set(PAGES[1:]) - linked == set()


def test_the_readme_stays_a_front_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
