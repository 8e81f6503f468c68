"""A streamed request's start at the door (`StatusCall.STREAM`): the one pass of the rate
step its stream makes (its parts make none), the version all its parts run on, and
admission's judgement of all its work against its deadline (its parts are then not judged
against the tier's budget again: `Item.streamed`)."""

from __future__ import annotations

from typing import Any

from api.config import Principal
from api.door.door import Door
from batcher import Tier


class StreamStart:
    """`StatusCall.STREAM`'s handler, in process and across a cell's link alike: plain
    values in and out."""

    def __init__(self, door: Door) -> None:
        self.door = door

    async def __call__(self, stream: str, tier: int, account: str, key: str | None,
                       model: str | None, sticky: str | None, items: int, chars: int,
                       seconds: float) -> tuple[Any, ...]:
        """Start the stream marked `stream` (`Job.stream`), of `items` inputs (`chars`
        characters) due `seconds` from now, judged with what the streams running now have
        yet to send ahead of it: ("ok", version, ready workers of it), or ("no", status,
        body, headers), its refusal."""
        door, principal = self.door, Principal(Tier(tier), account, key)
        try:
            await door.rate_passed(principal)
            version = door.core.resolve(model, sticky)
            now = door.clock.now()
            more, more_chars = door.promised.ahead(version or "", tier, now, stream)
            workers = door.core.judge(version, principal.tier, items + more, chars + more_chars,
                                      seconds)
        except Exception as exc:  # translated at the boundary, never a traceback
            refused = door.refusal(exc, principal.tier)
            return ("no", refused.status, refused.body, refused.headers)
        door.promised.promise(stream, version or "", tier, items, chars, now + seconds)
        return ("ok", version or "", workers)

    async def ended(self, stream: str) -> None:
        """`StatusCall.STREAM_END`: the stream marked `stream` ended (done, or its client
        left): what it did not send is no longer ahead of the streams that start."""
        self.door.promised.forget(stream)


__all__ = ["StreamStart"]
