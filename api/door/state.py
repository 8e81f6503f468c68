"""The durable layer `--state` names for a core (`sqlite:PATH`, `redis://`; none for
memory), its claims naming the core: its `CellIdentity`, given by whoever starts it (the
cell's supervisor: the same cell for every core it starts, one incarnation more at each
restart; a single process: a random cell of its own, incarnation 0)."""

from __future__ import annotations

import os

from api.config import Settings, StateKind
from api.kept import KeptState, Owner, RedisSettings, SqliteSettings, open_state
from gpu_pool import CellIdentity


def state_owner(identity: CellIdentity | None) -> Owner:
    """Who this core is to the durable layer: its cell and incarnation."""
    if identity is None:  # a process of its own: a cell of one core
        return Owner(os.urandom(6).hex(), 0)
    return Owner(identity.cell, identity.incarnation)


def build_state(settings: Settings, identity: CellIdentity | None = None
                ) -> KeptState | None:
    """The durable layer `--state` names (None for memory), its claims naming `identity`;
    connects to nothing yet."""
    spec = settings.state_spec()
    if spec.kind is StateKind.SQLITE:
        assert spec.path is not None
        return open_state(SqliteSettings(
            spec.path, ttl=settings.idempotency_ttl_s,
            max_entries=settings.idempotency_max_entries,
            max_bytes=settings.idempotency_max_bytes))
    if spec.kind is StateKind.REDIS:
        return open_state(RedisSettings(spec.host, spec.port, spec.db, state_owner(identity),
                                        ttl=settings.idempotency_ttl_s))
    return None


__all__ = ["build_state", "state_owner"]
