"""What a request waits with: the sink that collates its items' outputs, deadlines in shared
slots, and how it hears its client hang up."""

from __future__ import annotations

import asyncio
import contextvars
import math
from collections.abc import Callable
from typing import Generic, NamedTuple, Protocol, TypeVar

from starlette.types import Message, Receive

from batcher import Item, Refused

QUIET = contextvars.Context()
"""The context of callbacks that read no context variable (a waiter's timer and disconnect
watch, a request's deferred bookkeeping): passing it spares each request the copies asyncio
would make (and the collector the objects to walk)."""


class Collation:
    """The sink for one request's items: collates outputs in order, and ends once every
    item is answered, the first one fails, the client leaves or time runs out.

    Future-free: a subclass says what ending means. The core serving a gateway's jobs
    ends thousands a second, and a future, its callback and a timer for each cost the
    core process about as much CPU as the dispatch itself.
    """

    __slots__ = ("client_left", "error", "finished", "outputs", "refused", "remaining",
                 "skipped", "slot", "timed_out")

    def __init__(self, n: int) -> None:
        self.outputs: list[str | None] = [""] * n
        self.remaining = n
        self.error: BaseException | None = None
        self.client_left = False
        self.timed_out = False
        self.finished = False
        self.slot = -1  # its deadline's slot in `Deadlines`, if it has one there
        # None until the first: a request no guard refused or skipped pays nothing more.
        self.refused: list[tuple[int, str, str]] | None = None  # (index, guard, reason)
        self.skipped: list[str] | None = None  # guards that failed open, each once

    def item_done(self, item: Item, result: str | BaseException) -> None:
        if self.finished:
            return
        if isinstance(result, BaseException):
            if isinstance(result, Refused):  # one input's verdict: the others go on
                self.refuse(item, result)
                self.remaining -= 1
                if self.remaining == 0:
                    self._end()
                return
            self.error = result
            self._end()
            return
        if item.skipped:
            self.skip(item.skipped)
        self.outputs[item.index] = result
        self.remaining -= 1
        if self.remaining == 0:  # `_end`, inlined: a batch answers a hundred
            self.finished = True
            self.ended()

    def refuse(self, item: Item, refused: Refused) -> None:
        """A guard refused `item`: its output is None, and the answer names the guard and
        its reason (never the guard's text). Counting it answered is the caller's."""
        if item.skipped:
            self.skip(item.skipped)
        if self.refused is None:
            self.refused = []
        self.refused.append((item.index, refused.guard, refused.reason))
        self.outputs[item.index] = None

    def skip(self, guards: tuple[str, ...]) -> None:
        """An input's `guards` failed open: the answer says so (`Guard-Skipped`)."""
        if self.skipped is None:
            self.skipped = []
        for guard in guards:
            if guard not in self.skipped:
                self.skipped.append(guard)

    def expire(self) -> None:
        if not self.finished:
            self.timed_out = True
            self._end()

    def leave(self) -> None:
        """The client went away."""
        if not self.finished:
            self.client_left = True
            self._end()

    def _end(self) -> None:
        self.finished = True
        self.ended()

    def ended(self) -> None:
        """Called once, when the request is answered, failed, left or out of time."""
        raise NotImplementedError


class _Slot(NamedTuple):
    collations: dict[int, Collation]  # by id()
    timer: asyncio.TimerHandle


class Deadlines:
    """Collations that expire when their deadline passes, grouped in `slot_s` slots with one
    timer per slot: a timer of its own costs each request three objects for the collector
    to walk (the handle, uvloop's timer, the bound method) and a start and stop in the
    loop's timer heap. A deadline falls due at most `slot_s` late."""

    def __init__(self, slot_s: float = 0.01) -> None:
        self.slot_s = slot_s
        self._slots: dict[int, _Slot] = {}

    def add(self, collation: Collation, seconds: float, now: float) -> None:
        """`collation.expire()` in `seconds` from `now` (the loop's clock)."""
        slot = math.ceil((now + seconds) / self.slot_s)
        due = self._slots.get(slot)
        if due is None:
            timer = asyncio.get_running_loop().call_at(
                slot * self.slot_s, self._expire, slot, context=QUIET)
            due = self._slots[slot] = _Slot({}, timer)
        due.collations[id(collation)] = collation
        collation.slot = slot

    def discard(self, collation: Collation) -> None:
        """`collation` ended: once its slot holds no other, the slot's timer goes too. Left
        to fire, every slot lived as long as the timeout (60 s in the link benchmark: about
        6,400 slots, 32,000 objects that each collection walked)."""
        due = self._slots.get(collation.slot)
        if due is not None and due.collations.pop(id(collation), None) is not None \
                and not due.collations:
            del self._slots[collation.slot]
            due.timer.cancel()

    def clear(self) -> None:
        for due in self._slots.values():
            due.timer.cancel()
        self._slots.clear()

    def __len__(self) -> int:
        """Slots armed."""
        return len(self._slots)

    def _expire(self, slot: int) -> None:
        due = self._slots.pop(slot, None)
        if due is not None:
            for collation in list(due.collations.values()):
                collation.expire()


E = TypeVar("E")


class TurnEnds(Generic[E]):
    """What ends during one loop turn (the owner's, a timer's, a hang-up's), handed over
    together once the turn is over: a batch answers a hundred requests at once, and they are
    concluded with one reading of the clock, and written or framed together."""

    __slots__ = ("_conclude", "_ended", "_flushing")

    def __init__(self, conclude: Callable[[list[E]], None]) -> None:
        self._conclude = conclude
        self._ended: list[E] = []
        self._flushing: asyncio.Handle | None = None

    def add(self, ended: E) -> None:
        if not self._ended:
            self._flushing = asyncio.get_running_loop().call_soon(self._flush, context=QUIET)
        self._ended.append(ended)

    def flush(self) -> None:
        """Conclude what ended so far now: the owner's turn is over (`CoreOwner.after_turns`),
        and the loop pass `add` waits for would only put the answers behind whatever else
        is ready (about 0.3 ms a batch in the guard benchmark)."""
        if self._ended:
            assert self._flushing is not None
            self._flushing.cancel()
            self._flush()

    def _flush(self) -> None:
        ended, self._ended, self._flushing = self._ended, [], None
        self._conclude(ended)


class ClientWatch(Protocol):
    """Hears a request's client hang up while its answer is awaited."""

    def watch(self, leave: Callable[[], object]) -> None:
        """Call `leave` once if the client goes (at once if it is gone) before `unwatch`."""

    def unwatch(self) -> None: ...


CONNECTION = "batchgate.connection"
"""The scope key under which batchgate's HTTP protocol (`api.http.protocol`) hands a request
its connection's `ClientWatch`: the connection itself tells the waiting request that the
client hung up. Under another server a task waits on `receive()` instead (`ReceiveWatch`):
a task, two coroutines and a future more per request, for the server's CPU and for the
collector to walk."""


class ReceiveWatch:
    """A `ClientWatch` for any ASGI server: a task waits on `receive()`."""

    __slots__ = ("_receive", "_task")

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._task: asyncio.Task[Message] | None = None

    def watch(self, leave: Callable[[], object]) -> None:
        def heard(receiving: asyncio.Task[Message]) -> None:
            if not receiving.cancelled() and receiving.exception() is None \
                    and receiving.result()["type"] == "http.disconnect":
                leave()

        self._task = asyncio.get_running_loop().create_task(
            self._receive(), context=QUIET  # type: ignore[arg-type]  # a coroutine fn
        )
        self._task.add_done_callback(heard, context=QUIET)

    def unwatch(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None


class PendingRequest(Collation):
    """A `Collation` that a request handler awaits in process.

    A bare asyncio future rather than an anyio event and cancel scope: this is the hot
    path, paid once per request (the API runs under uvicorn, on asyncio, only).
    """

    __slots__ = ("done",)

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def ended(self) -> None:
        # Its waiter may have been cancelled (a gRPC handler whose client left, a task
        # group torn down): the items it could not withdraw still land here, and must not
        # raise into the core that settles them.
        if not self.done.done():
            self.done.set_result(None)

    async def wait(self, seconds: float, client: ClientWatch | None) -> None:
        """Wait for the answer, the deadline, or the client leaving, whichever comes first.
        Without `client` only `leave()` says the client left."""
        timer = asyncio.get_running_loop().call_later(seconds, self.expire, context=QUIET)
        if client is not None:
            client.watch(self.leave)
        try:
            await self.done
        finally:
            timer.cancel()
            if client is not None:
                client.unwatch()


__all__ = ["CONNECTION", "QUIET", "ClientWatch", "Collation", "Deadlines", "PendingRequest",
           "ReceiveWatch", "TurnEnds"]
