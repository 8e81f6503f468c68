from pathlib import Path

import pytest

from api import KeyRing, Unauthorized, load_keys
from api.auth import KeysFileError
from batcher import Tier

EXAMPLE = Path(__file__).parents[2] / "examples" / "keys.toml"


def test_the_shipped_example_maps_paid_free_and_admin() -> None:
    ring = load_keys(EXAMPLE)
    assert ring.identify("Bearer paid-demo-key").tier is Tier.PAID
    assert ring.identify("Bearer free-demo-key").tier is Tier.FREE
    assert ring.is_admin("Bearer admin-demo-key")
    assert not ring.is_admin("Bearer paid-demo-key")


def test_no_key_is_anonymous_free_tier() -> None:
    principal = load_keys(EXAMPLE).identify(None)
    assert principal.tier is Tier.FREE and principal.account == "anonymous"


def test_unknown_or_malformed_keys_are_refused() -> None:
    ring = load_keys(EXAMPLE)
    for header in ("Bearer nope", "Basic abc", "Bearer "):
        with pytest.raises(Unauthorized):
            ring.identify(header)


def test_anonymous_use_can_be_switched_off(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('anonymous = false\n[[keys]]\nkey = "k"\ntier = "paid"\n')
    with pytest.raises(Unauthorized):
        load_keys(keys).identify(None)


@pytest.mark.parametrize(
    "text",
    ['[[keys]]\ntier = "paid"\n', '[[keys]]\nkey = "k"\ntier = "gold"\n', "anonymous = 3\n",
     "not toml ===", '[admin]\nkeys = "x"\n'],
)
def test_malformed_keys_files_say_what_is_wrong(tmp_path: Path, text: str) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(text)
    with pytest.raises(KeysFileError, match="keys file"):
        load_keys(keys)


def test_without_a_file_only_the_admin_flag_is_known() -> None:
    ring = load_keys(None, admin_key="root")
    assert isinstance(ring, KeyRing) and ring.is_admin("Bearer root")


def test_a_non_ascii_admin_token_is_refused_not_an_error() -> None:
    ring = load_keys(None, admin_key="root")
    # ASGI headers decode as latin-1: "\xe9" is what `Bearer \xe9` on the wire becomes.
    assert not ring.is_admin("Bearer \xe9") and not ring.is_admin("Bearer r\u00f6\u00f6t")
