"""Running a page's example: its server, its address, and what it must do by its kind."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from tests.docs.expect import differences, json_values, printed_as_commented, steps
from tests.docs.live import BIN, DOCUMENTED, Server, serving, shell
from tests.docs.pages import Block

MODEL_FLAGS = {"--model", "--models"}


class Servers:
    """One server per set of flags, started when an example first needs it. `model`: the
    flags that stand in for the real model where a block's own flags name no model (its
    answers then differ from the page's); `more`: flags every server gets."""

    def __init__(self, stack: ExitStack, model: tuple[str, ...], more: tuple[str, ...] = (),
                 ready_timeout_s: float = 60) -> None:
        self.stack, self.model, self.more = stack, model, more
        self.ready_timeout_s = ready_timeout_s
        self.running: dict[tuple[str, ...], Server] = {}

    def flags_of(self, block: Block) -> tuple[str, ...]:
        assert block.serve is not None
        named = MODEL_FLAGS & {f.split("=")[0] for f in block.serve}
        return block.serve if named else (*block.serve, *self.model)

    def address(self, block: Block) -> tuple[str, bool]:
        """The block's text with the documented address turned into its server's, and
        whether its outputs are the page's own (the server runs the model the page shows)."""
        if block.serve is None:
            assert DOCUMENTED not in block.text, f"{block.name} talks to a server: give it one"
            return block.text, True
        flags = self.flags_of(block)
        return self.start(flags).address(block.text), flags == block.serve

    def start(self, flags: tuple[str, ...]) -> Server:
        if flags not in self.running:
            self.running[flags] = self.stack.enter_context(
                serving((*flags, *self.more), self.ready_timeout_s))
        return self.running[flags]


def transcript(text: str, exact: bool, folder: Path) -> None:
    """Each command exits 0 and prints what the page shows after it."""
    for step in steps(text):
        done = shell(step.command, folder)
        assert done.returncode == 0, f"{step.command}\n{done.stderr}"
        assert differences(step.shown, done.stdout, exact) == [], step.command


def answers(text: str, exact: bool, folder: Path) -> None:
    """Every `curl` of the block prints one JSON answer, and none is an error."""
    done = shell(text, folder)
    assert done.returncode == 0, done.stderr
    printed = json_values(done.stdout)
    assert len(printed) == sum(line.startswith("curl ") for line in text.splitlines())
    assert [a for a in printed if not isinstance(a, dict) or "error" in a] == []


def runs(text: str, exact: bool, folder: Path) -> None:
    """The block exits 0."""
    done = shell(text, folder, timeout_s=180)
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-2000:]}"


def python(text: str, exact: bool, folder: Path) -> None:
    """The block runs as a script, and prints what its `print(...)  # ...` lines say."""
    script = folder / "example.py"
    script.write_text(text)
    done = shell(f"{BIN / 'python'} {script}", folder)
    assert done.returncode == 0, done.stderr
    assert printed_as_commented(text, done.stdout, exact) == []


CHECKS: dict[str, Callable[[str, bool, Path], None]] = {
    "transcript": transcript, "answers": answers, "runs": runs, "python": python}
