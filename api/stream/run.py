"""A streamed request, run as parts through the core's door a window at a time.

Its inputs go to the core in parts of `PART_INPUTS`, each an ordinary job (admitted,
batched, re-run, guarded, kept like any request's), so a stream rides many batches on many
workers at once, in a single process and across a cell's link alike. At most `window`
inputs are out at once, answered ones not yet sent included: a client that stops reading
stops the window (its writes wait, and nothing more is sent to the core meanwhile), so the
memory a stream holds is bounded by its window, not by its size.

Events go out in the order parts are answered. A keyed stream's parts are numbered by the
door as they are answered (`api.door.positions`), and that number is kept with each part's
answer: every connection to the stream sends each event under the same number, which is
what lets a client resume after the last event it has (`after`). Without a key, a client
that leaves withdraws every input not yet in a batch (`leave`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Callable

from api.http import ClientWatch, CoreView, Framing, Job, answer_id
from api.stream.events import PartEvents, done_event, failed, failed_by, part_events

PART_INPUTS = 25
"""Inputs per part: a quarter of a full batch, so a part mostly rides one batch (its events
wait for its last input) while a stream of 10,000 costs the door 400 jobs, not 10,000."""


class _PartWatch:
    """How a part hears that its stream's client left (a `ClientWatch`)."""

    __slots__ = ("leave",)

    def __init__(self) -> None:
        self.leave: Callable[[], object] | None = None

    def watch(self, leave: Callable[[], object]) -> None:
        self.leave = leave

    def unwatch(self) -> None:
        self.leave = None


_UNFINISHED: set[asyncio.Task[None]] = set()  # parts left running by a stream that ended


class StreamRun:
    """One streamed request's parts, window and order. `job`: all its inputs, naming the
    version its parts run on, and the stream's mark (`Job.stream`: its Idempotency-Key if
    it has one); `after`: events the client already has (a resume); `window`: inputs out
    at once."""

    def __init__(self, core: CoreView, job: Job, framing: Framing, window: int,
                 after: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self._core, self._job, self._framing = core, job, framing
        self._window, self._after, self._clock = max(window, PART_INPUTS), after, clock
        self._deadline = clock() + job.timeout
        n = len(job.texts)
        self._parts = [(first, min(PART_INPUTS, n - first)) for first in range(0, n, PART_INPUTS)]
        self._launched = 0  # parts sent to the core, or answered here
        self._out = 0  # inputs of parts out: running, or answered and not yet sent
        self._running: dict[int, tuple[_PartWatch, asyncio.Task[None]]] = {}
        self._answered: asyncio.Queue[PartEvents | None] = asyncio.Queue()
        self._keyed = job.idempotency is not None
        self._held: dict[int, PartEvents] = {}  # a keyed stream's parts, by place
        self._loose: list[PartEvents] = []  # a keyed stream's parts the door did not number
        self._seq = 0  # the number of the next event, in order
        self.outputs = self.errors = 0
        self.model = job.model or ""
        self.mark = job.stream or ""  # what the door knows it by
        self.answer_id: str | None = None  # its `done` event's id, once sent
        self.first_sent: float | None = None  # when the first event went out
        self.left = False
        self.finished = False

    async def events(self) -> AsyncIterator[bytes]:
        """The stream's bytes as they are ready, framed; ends after `done`, or when its
        client left."""
        while True:
            self._launch()
            if not self._running and self._answered.empty() \
                    and self._launched == len(self._parts):
                break
            got = await self._answered.get()
            if got is None:  # its client left
                return
            sent = [self._sent(got)]
            while not self._answered.empty():  # what landed with it goes in one write
                more = self._answered.get_nowait()
                if more is None:
                    return
                sent.append(self._sent(more))
            chunk = b"".join(sent)
            if chunk:
                if self.first_sent is None:
                    self.first_sent = self._clock()
                yield chunk
        self.finished = True
        yield self._rest()

    def leave(self) -> None:
        """Its client left: every part not yet answered is withdrawn (a keyed one's inputs
        already in a batch run on, and their answer is kept for a resume)."""
        if self.left or self.finished:
            return
        self.left = True
        for watch, task in self._running.values():
            if watch.leave is not None:
                watch.leave()
            _UNFINISHED.add(task)
            task.add_done_callback(_UNFINISHED.discard)
        self._answered.put_nowait(None)

    def _launch(self) -> None:
        """Send parts while the window has room (always at least one part out)."""
        parts, job = self._parts, self._job
        while self._launched < len(parts):
            at = self._launched
            first, count = parts[at]
            if self._out and self._out + count > self._window:
                return
            self._launched += 1
            self._out += count
            left = self._deadline - self._clock()
            if left <= 0:
                self._answered.put_nowait(failed(
                    "deadline_exceeded", "the request's deadline passed before this input "
                    "was sent to a worker", first, count))
                continue
            part = job._replace(texts=job.texts[first:first + count], single=False,
                                timeout=left, idempotency=self._part_key(at),
                                stream=job.stream or "")
            watch = _PartWatch()
            task = asyncio.get_running_loop().create_task(
                self._run(at, part, watch, first, count))
            self._running[at] = (watch, task)

    def _part_key(self, at: int) -> tuple[str, bytes] | None:
        """A keyed stream's part is keyed too, under a name no client can send (a space),
        bound to the stream's body and its place in it."""
        if self._job.idempotency is None:
            return None
        key, digest = self._job.idempotency
        return (f"{key} #{at}", hashlib.sha256(digest + at.to_bytes(4, "big")).digest())

    async def _run(self, at: int, part: Job, watch: ClientWatch, first: int, count: int
                   ) -> None:
        if self.left:  # its client left before this task began: it never reaches the core
            self._running.pop(at, None)
            return
        try:
            answered = part_events(await self._core.run(part, watch), first, count)
        except Exception as exc:  # the part's inputs get its error; the stream goes on
            answered = failed_by(exc, first, count)
        self._running.pop(at, None)  # before its answer is read: `events` counts on it
        if not self.left:
            self._answered.put_nowait(answered)

    def _sent(self, part: PartEvents) -> bytes:
        """What can go out now that `part` is answered, framed."""
        self._out -= len(part.events)
        self.errors += part.errors
        self.outputs += len(part.events) - part.errors
        if part.model:
            self.model = part.model
        if not self._keyed:
            return self._framed(part)
        if part.position is None:
            self._loose.append(part)
            return b""
        self._held[part.position] = part
        out: list[bytes] = []
        while self._seq in self._held:
            out.append(self._framed(self._held.pop(self._seq)))
        return b"".join(out)

    def _framed(self, part: PartEvents, at: int | None = None) -> bytes:
        """`part`'s events under the numbers from `at` (the next in order if None), those
        the client already has left out."""
        seq = self._seq if at is None else at
        frame, after = self._framing.frame, self._after
        out = [frame(seq + i, event) for i, event in enumerate(part.events) if seq + i >= after]
        self._seq = max(self._seq, seq + len(part.events))
        return b"".join(out)

    def _rest(self) -> bytes:
        """The end: a keyed stream's parts held behind a number that never came (an answer
        not kept, whose inputs ran again under a new one) in their order, those the door
        did not number after them, then `done`."""
        out = [self._framed(self._held[at], at) for at in sorted(self._held)]
        out += [self._framed(part) for part in self._loose]
        self._held, self._loose = {}, []
        self.answer_id = answer_id()
        done = done_event(self.answer_id, self.model, self.outputs, self.errors)
        out.append(self._framing.frame(self._seq, done) if self._seq >= self._after else b"")
        return b"".join(out)


__all__ = ["PART_INPUTS", "StreamRun"]
