"""Configuration, built at the edge: the settings record and its flags and variables (with
`--state` read once into a `StateSpec`), the keys file (keys -> tier and account, admin
keys) and what each tier is promised.

A leaf of api/: it imports only `api.errors` and `batcher`'s nouns, so a gateway and a
client's tooling can load it without the dispatch core.
"""

from api.config.flags import (
    ENV_PREFIX,
    MASK,
    Knob,
    Parser,
    add_settings_flags,
    describe,
    forget_secrets,
    knobs,
    markdown_table,
    settings_from,
)
from api.config.keys import (
    ANONYMOUS,
    ANONYMOUS_ACCOUNT,
    HASHED,
    KeyRing,
    Principal,
    hash_key,
    load_keys,
)
from api.config.settings import (
    Settings,
    Workers,
    check_files,
    doc,
    parse_bool,
    parse_gateways,
)
from api.config.state import STATE_FORMS, StateKind, StateSpec, parse_state
from api.config.tiers import DEFAULT_TIERS, TierPolicy, tiers_from

__all__ = [
    "ANONYMOUS",
    "ANONYMOUS_ACCOUNT",
    "DEFAULT_TIERS",
    "ENV_PREFIX",
    "HASHED",
    "MASK",
    "STATE_FORMS",
    "KeyRing",
    "Knob",
    "Parser",
    "Principal",
    "Settings",
    "StateKind",
    "StateSpec",
    "TierPolicy",
    "Workers",
    "add_settings_flags",
    "check_files",
    "describe",
    "doc",
    "forget_secrets",
    "hash_key",
    "knobs",
    "load_keys",
    "markdown_table",
    "parse_bool",
    "parse_gateways",
    "parse_state",
    "settings_from",
    "tiers_from",
]
