"""API keys -> tier and account, from a TOML keys file (see examples/keys.toml)."""

from __future__ import annotations

import hashlib
import hmac
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from api.config.tiers import DEFAULT_TIERS, TierPolicy, tiers_from
from api.errors import KeysFileError, Unauthorized
from batcher import Tier

ANONYMOUS_ACCOUNT = "anonymous"


@dataclass(frozen=True, slots=True)
class Principal:
    tier: Tier
    account: str
    key: str | None  # None for anonymous requests


ANONYMOUS = Principal(Tier.FREE, ANONYMOUS_ACCOUNT, None)


HASHED = "sha256:"  # a keys file may hold `sha256:<hex>` of a key instead of the key


def hash_key(key: str) -> str:
    """What a keys file holds for `key` when it must not hold the key itself."""
    return HASHED + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


KEY_ACCOUNT = "key-"  # an entry without `account`: this and the head of its key's SHA-256


def key_account(key: str) -> str:
    """The account of a keys entry that names none. Never the key: an account is written to
    the access log and into the names of Redis keys. Derived from the key's hash, so every
    process of a cell and every restart name it alike, and an entry holding the key hashed
    gets the account the plain key would."""
    digest = key if key.startswith(HASHED) else hash_key(key)
    return KEY_ACCOUNT + digest.removeprefix(HASHED)[:16]


@dataclass(frozen=True, slots=True)
class KeyRing:
    keys: dict[str, Principal]  # by the key, or by `hash_key(key)` for a hashed entry
    admin_keys: frozenset[str]  # the same: plain keys and hashed ones
    anonymous: bool = True
    tiers: dict[Tier, TierPolicy] = field(default_factory=lambda: dict(DEFAULT_TIERS))
    hashed: bool = False  # some key is held hashed: a miss is hashed and looked up again
    # Fair share within a tier: each account's weight, where its entries name one (else 1).
    weights: dict[str, float] = field(default_factory=dict)

    def identify(self, authorization: str | None) -> Principal:
        """Map an Authorization header to a principal; raise Unauthorized."""
        if not authorization:
            if self.anonymous:
                return ANONYMOUS
            raise Unauthorized("an API key is required (Authorization: Bearer <key>)")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <key>'")
        token = token.strip()
        principal = None
        if not token.startswith(HASHED):  # a hashed entry opens with its key, not its hash
            principal = self.keys.get(token)
            if principal is None and self.hashed:
                principal = self.keys.get(hash_key(token))
        if principal is None:
            raise Unauthorized("unknown API key")
        return principal

    def is_admin(self, authorization: str | None) -> bool:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        given = token.encode("utf-8", "surrogateescape")  # any header value, never a 500
        hashed = hash_key(token).encode()
        return scheme.lower() == "bearer" and not token.startswith(HASHED) and any(
            hmac.compare_digest(hashed if k.startswith(HASHED) else given, k.encode())
            for k in self.admin_keys
        )


def load_keys(path: Path | None, admin_key: str | None = None) -> KeyRing:
    """Read a keys file; without one, everyone is anonymous free tier."""
    admins = {admin_key} if admin_key else set()
    if path is None:
        return KeyRing({}, frozenset(admins))
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise KeysFileError(f"keys file {path}: {exc}") from exc
    keys: dict[str, Principal] = {}
    weights: dict[str, float] = {}
    for n, entry in enumerate(data.get("keys", []), start=1):
        key, tier, account = entry.get("key"), entry.get("tier"), entry.get("account")
        if not isinstance(key, str) or not key:
            raise KeysFileError(f"keys file {path}: keys entry {n} has no 'key'")
        if tier not in ("paid", "free"):
            raise KeysFileError(f"keys file {path}: key entry {n}: tier must be paid or free")
        if key in keys:
            raise KeysFileError(f"keys file {path}: key entry {n} repeats a key")
        if key.startswith(HASHED) and not _is_hash(key):
            raise KeysFileError(f"keys file {path}: key entry {n}: sha256: needs 64 hex digits")
        keys[key] = principal = Principal(Tier[tier.upper()], str(account or key_account(key)),
                                          key)
        _weigh(weights, principal.account, entry, f"keys file {path}: key entry {n}")
    admin = data.get("admin", {}).get("keys", [])
    if not isinstance(admin, list) or not all(isinstance(k, str) and k for k in admin):
        raise KeysFileError(f"keys file {path}: admin.keys must be a list of strings")
    if any(k.startswith(HASHED) and not _is_hash(k) for k in admin):
        raise KeysFileError(f"keys file {path}: admin.keys: sha256: needs 64 hex digits")
    anonymous = data.get("anonymous", True)
    if not isinstance(anonymous, bool):
        raise KeysFileError(f"keys file {path}: anonymous must be true or false")
    try:
        tiers = tiers_from(data.get("tiers", {}))
    except (ValueError, TypeError) as exc:
        raise KeysFileError(f"keys file {path}: {exc}") from exc
    everyone = [*keys, *admin]
    return KeyRing(keys, frozenset(admins | set(admin)), anonymous, tiers,
                   hashed=any(k.startswith(HASHED) for k in everyone), weights=weights)


def _weigh(weights: dict[str, float], account: str, entry: dict[str, object], where: str
           ) -> None:
    """Note an entry's optional `weight` (a number > 0) for its account: the entries of one
    account that name a weight must name the same (those that name none take it)."""
    weight = entry.get("weight")
    if weight is None:
        return
    if isinstance(weight, bool) or not isinstance(weight, int | float) \
            or not 0 < weight < math.inf:
        raise KeysFileError(f"{where}: weight must be a number > 0, not {weight!r}")
    known = weights.setdefault(account, float(weight))
    if known != weight:
        raise KeysFileError(f"{where}: weight {weight} differs from the weight {known} "
                            f"another entry gives account {account!r}")


def _is_hash(key: str) -> bool:
    digest = key.removeprefix(HASHED)
    return len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


__all__ = ["ANONYMOUS", "ANONYMOUS_ACCOUNT", "HASHED", "KEY_ACCOUNT", "KeyRing", "Principal",
           "hash_key", "key_account", "load_keys"]
