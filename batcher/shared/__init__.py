"""Small pieces every process of batchgate shares: the framed-message transport (a cell's
link, a worker's pipe) and the backoff of whatever restarts what keeps dying (a worker's
slot, the cell's core and gateways). They know nothing of batches."""

from batcher.shared.backoff import Backoff
from batcher.shared.framing import READ_CHUNK, Framed, FrameReader, frame

__all__ = ["READ_CHUNK", "Backoff", "FrameReader", "Framed", "frame"]
