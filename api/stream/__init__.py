"""Streamed answers: a request of up to `--max-stream-inputs` inputs answered as events,
one per input as its batch lands (Server-Sent Events or NDJSON), its inputs fed to the
core in parts through a window, a keyed stream resumable after the last event its client
has. docs/streaming.md says how and why.

Offers `StreamRoute` (the streamed way of the hot route, which whoever builds the routes
gives them: `Routes.streamed`), `StreamRun` (one stream's parts, window and order) and the
events (`part_events`, `done_event`)."""

from api.stream.events import PartEvents, done_event, failed, part_events
from api.stream.route import StreamResponse, StreamRoute, resume_point
from api.stream.run import PART_INPUTS, StreamRun

__all__ = ["PART_INPUTS", "PartEvents", "StreamResponse", "StreamRoute", "StreamRun",
           "done_event", "failed", "part_events", "resume_point"]
