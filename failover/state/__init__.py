"""Kept answers that outlive processes (`--state`): the durable layer behind the in-memory
idempotency store, and the store that puts one in front of the other.

`KeptState` is the seam, `SqliteState` (an embedded file, one server per file) and
`RedisState` (a Redis server that cells share; loaded only by `open_state`, since it needs
the `redis` client) implement it, and `BackedStore` is what the door is given.
"""

from failover.state.backed import BUSY_POLL_S, LEASE_MARGIN_S, BackedStore
from failover.state.errors import StateLocked, StateUnavailable
from failover.state.seam import Busy, Claim, Claimed, KeptState, Stored
from failover.state.spec import Owner, RedisSettings, SqliteSettings, open_state
from failover.state.sqlite import SqliteState

__all__ = [
    "BUSY_POLL_S",
    "LEASE_MARGIN_S",
    "BackedStore",
    "Busy",
    "Claim",
    "Claimed",
    "KeptState",
    "Owner",
    "RedisSettings",
    "SqliteSettings",
    "SqliteState",
    "StateLocked",
    "StateUnavailable",
    "Stored",
    "open_state",
]
