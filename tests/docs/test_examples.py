"""Every example of the documentation runs as its reader would run it, against a live server.

The blocks are read from the pages themselves (tests/docs/pages.py says how they are
marked), so an example that drifts from what the server does fails here. The README's
server is `scripts/serve` with the real model; here it serves `sim` instead, which starts in
a second and answers every input reversed, so those answers are compared by their shape
(the real model's own answers: test_examples_minilm.py). Each server is started once, for
the flags its examples name.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.docs.examples import CHECKS, Servers
from tests.docs.pages import KINDS, NOT_RUN, PAGES, ROOT, Block, blocks

pytestmark = pytest.mark.e2e

EXAMPLES = [b for page in PAGES for b in blocks(page) if b.kind in KINDS]


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    with ExitStack() as stack:
        yield Servers(stack, model=("--model", "sim"))


def test_every_block_of_the_readme_is_run_or_says_why_not() -> None:
    unmarked = [b.name for b in blocks(ROOT / "README.md") if b.kind not in (*KINDS, NOT_RUN)]
    assert unmarked == []


def test_every_marker_names_a_kind_and_the_language_its_kind_runs() -> None:
    language = {"transcript": "sh", "answers": "sh", "runs": "sh", "python": "python"}
    wrong = [b.name for page in PAGES for b in blocks(page)
             if b.kind is not None and b.kind != NOT_RUN and language.get(b.kind) != b.lang]
    assert wrong == []


@pytest.mark.parametrize("block", EXAMPLES, ids=lambda b: f"{b.name}:{b.kind}")
def test_the_example_does_what_its_page_says(block: Block, servers: Servers,
                                              tmp_path: Path) -> None:
    """In the pages' order, as a reader runs them: a page's later example may build on
    what an earlier one changed (models.md retires a version after using it). Each runs in
    a folder of its own, which keeps what it leaves (schemathesis' `.schemathesis/`)."""
    if "curl " in block.text and shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    text, exact = servers.address(block)
    CHECKS[str(block.kind)](text, exact, tmp_path)
