"""Small pieces every process of batchgate shares: the framed-message transport (a cell's
link, a worker's pipe) and the backoff of whatever restarts what keeps dying (a worker's
slot, the cell's core and gateways), and a process's own name and parent-death signal.
They know nothing of batches."""

from batcher.shared.backoff import Backoff
from batcher.shared.framing import READ_CHUNK, Framed, FrameReader, frame
from batcher.shared.process import die_with_parent, name_process, prctl

__all__ = ["READ_CHUNK", "Backoff", "FrameReader", "Framed", "die_with_parent", "frame",
           "name_process", "prctl"]
