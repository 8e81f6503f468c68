"""A streamed call's I/O, blocking (`Stream`) and async (`AsyncStream`): each an iterator of
the results as they arrive, carrying out what its `StreamCall` decides, and holding the done
event in `done` once the stream has ended.

Leaving early: close it (`close()` / `aclose()`), or read it in a `with` / `async with`
block, which closes its connection at the end; a stream read to its end closes itself."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from types import TracebackType
from typing import Self

import anyio
import httpx

from batchgate_client.call import PATH
from batchgate_client.events import Done, Result
from batchgate_client.resume import StreamCall


class Stream:
    """The results of a blocking client's `stream()`, an `Output` or a `Failure` per input,
    in the order they complete (resumed past a drop when the call has a key); raises a
    BatchgateError as `Client.batchstring` does, `StreamBroken` when a drop cannot be
    resumed. `done`: the stream's done event once iterated to its end, else None."""

    def __init__(self, http: httpx.Client, call: StreamCall, clock: Callable[[], float],
                 sleep: Callable[[float], None]) -> None:
        self._call = call
        self._results = self._run(http, clock, sleep)

    @property
    def done(self) -> Done | None:
        return self._call.done

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Result:
        return next(self._results)

    def _run(self, http: httpx.Client, clock: Callable[[], float],
             sleep: Callable[[float], None]) -> Generator[Result]:
        call = self._call
        while call.done is None:
            attempt = call.request(clock())
            try:
                response = http.send(http.build_request("POST", PATH, **attempt), stream=True)
            except httpx.TransportError as exc:
                sleep(call.broke(exc, clock()))
                continue
            try:
                if response.status_code != 200:
                    response.read()
                wait = call.opened(response, clock())
                if wait is None:
                    for chunk in response.iter_bytes():
                        yield from call.feed(chunk)
                        if call.done is not None:
                            return
                    wait = call.broke(None, clock())
            except httpx.TransportError as exc:
                wait = call.broke(exc, clock())
            finally:
                response.close()
            sleep(wait)

    def close(self) -> None:
        """Ends the stream here and closes its connection (nothing more is yielded)."""
        self._results.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class AsyncStream:
    """The same for the async client's `stream()` (`async for`, `async with`); the opening
    of each connection is also bounded as a whole by what is left of the deadline."""

    def __init__(self, http: httpx.AsyncClient, call: StreamCall, clock: Callable[[], float],
                 sleep: Callable[[float], Awaitable[None]]) -> None:
        self._call = call
        self._results = self._run(http, clock, sleep)

    @property
    def done(self) -> Done | None:
        return self._call.done

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Result:
        return await anext(self._results)

    async def _run(self, http: httpx.AsyncClient, clock: Callable[[], float],
                   sleep: Callable[[float], Awaitable[None]]) -> AsyncGenerator[Result]:
        call = self._call
        while call.done is None:
            attempt = call.request(clock())
            try:
                with anyio.fail_after(attempt["timeout"]):
                    response = await http.send(http.build_request("POST", PATH, **attempt),
                                               stream=True)
            except (httpx.TransportError, TimeoutError) as exc:
                await sleep(call.broke(exc, clock()))
                continue
            try:
                if response.status_code != 200:
                    await response.aread()
                wait = call.opened(response, clock())
                if wait is None:
                    async for chunk in response.aiter_bytes():
                        for result in call.feed(chunk):
                            yield result
                        if call.done is not None:
                            return
                    wait = call.broke(None, clock())
            except httpx.TransportError as exc:
                wait = call.broke(exc, clock())
            finally:
                with anyio.CancelScope(shield=True):
                    await response.aclose()
            await sleep(wait)

    async def aclose(self) -> None:
        """Ends the stream here and closes its connection (nothing more is yielded)."""
        await self._results.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


__all__ = ["AsyncStream", "Stream"]
