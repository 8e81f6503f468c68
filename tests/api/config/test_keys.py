import hashlib
import io
from pathlib import Path

import pytest

from api.cli import main
from api.config import KeyRing, hash_key, load_keys
from api.door.shared_limits import bucket_names
from api.errors import KeysFileError, Unauthorized
from batcher import Tier

EXAMPLE = Path(__file__).parents[3] / "examples" / "keys.toml"


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


def hashed_keys(tmp_path: Path, paid: str, admin: str) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text(f'[admin]\nkeys = ["{hash_key(admin)}"]\n\n'
                    f'[[keys]]\nkey = "{hash_key(paid)}"\ntier = "paid"\naccount = "acme"\n')
    return path


def test_a_hashed_key_opens_with_the_key_and_never_with_its_hash(tmp_path: Path) -> None:
    ring = load_keys(hashed_keys(tmp_path, "the-real-key", "the-admin-key"))
    principal = ring.identify("Bearer the-real-key")
    assert principal.tier is Tier.PAID and principal.account == "acme"
    assert principal.key == hash_key("the-real-key")  # what crosses the link and the logs
    for header in (f"Bearer {hash_key('the-real-key')}", "Bearer the-real-key2"):
        with pytest.raises(Unauthorized):
            ring.identify(header)
    assert ring.is_admin("Bearer the-admin-key")
    assert not ring.is_admin(f"Bearer {hash_key('the-admin-key')}")
    assert not ring.is_admin("Bearer the-real-key")


@pytest.mark.parametrize("entry", ['key = "sha256:abc"', 'key = "sha256:' + "g" * 64 + '"'])
def test_a_malformed_hash_is_refused_at_load(tmp_path: Path, entry: str) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(f'[[keys]]\n{entry}\ntier = "paid"\n')
    with pytest.raises(KeysFileError, match="64 hex"):
        load_keys(path)


def test_keys_hash_reads_the_key_on_stdin(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("the-real-key\n"))
    assert main(["keys", "hash"]) == 0
    assert capsys.readouterr().out.strip() == hash_key("the-real-key")
    assert hash_key("the-real-key") == "sha256:" + hashlib.sha256(b"the-real-key").hexdigest()


def test_a_key_without_an_account_is_accounted_by_its_hash_never_by_itself(
        tmp_path: Path) -> None:
    plain, hashed = tmp_path / "plain.toml", tmp_path / "hashed.toml"
    plain.write_text('[[keys]]\nkey = "the-real-key"\ntier = "paid"\n')
    hashed.write_text(f'[[keys]]\nkey = "{hash_key("the-real-key")}"\ntier = "paid"\n')
    account = load_keys(plain).identify("Bearer the-real-key").account
    assert account == "key-" + hashlib.sha256(b"the-real-key").hexdigest()[:16]
    # The same from the file holding it hashed, and in every process that reads the file.
    assert load_keys(hashed).identify("Bearer the-real-key").account == account
    assert load_keys(plain).identify("Bearer the-real-key").account == account


def test_the_shared_limits_name_an_account_less_key_by_hashes_alone(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[[keys]]\nkey = "the-real-key"\ntier = "paid"\n')
    names = bucket_names(load_keys(keys).identify("Bearer the-real-key"))
    assert not any("the-real-key" in name for name in names)


def test_an_accounts_weight_is_read_once_for_all_its_keys(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[[keys]]\nkey = "a1"\ntier = "paid"\naccount = "acme"\nweight = 3\n'
                    '[[keys]]\nkey = "a2"\ntier = "free"\naccount = "acme"\n'
                    '[[keys]]\nkey = "b"\ntier = "paid"\naccount = "small"\nweight = 0.5\n'
                    '[[keys]]\nkey = "c"\ntier = "paid"\naccount = "plain"\n')
    assert load_keys(keys).weights == {"acme": 3.0, "small": 0.5}  # "plain" weighs 1


@pytest.mark.parametrize("weight", ["0", "-1", '"2"', "true", "nan", "inf"])
def test_a_weight_that_is_no_positive_number_is_refused(tmp_path: Path, weight: str) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[[keys]]\nkey = "k"\ntier = "paid"\naccount = "a"\nweight = {weight}\n')
    with pytest.raises(KeysFileError, match=r"key entry 1: weight must be a number > 0"):
        load_keys(keys)


def test_two_weights_for_one_account_are_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[[keys]]\nkey = "a1"\ntier = "paid"\naccount = "acme"\nweight = 2\n'
                    '[[keys]]\nkey = "a2"\ntier = "free"\naccount = "acme"\nweight = 3\n')
    with pytest.raises(KeysFileError, match=r"key entry 2: weight 3 differs .* 'acme'"):
        load_keys(keys)
