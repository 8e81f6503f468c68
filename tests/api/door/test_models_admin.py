"""The admin API of the catalogue (`ModelsAdmin`) over real cores with workers, in virtual
time: what GET shows, what PUT and DELETE change or refuse (and with which error), and
SIGHUP's re-read of the file, which changes everything or nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from api.door.models import ModelsAdmin
from failover.fleet.catalogue import Catalogue, parse_catalogue
from tests.failover.fleet.driver import World

FILE = """
[models.topics]
default = "v1"
max_workers = 3
[models.topics.versions.v1]
spec = "sim"
load_s = 2
[models.topics.versions.v2]
spec = "sim"
[models.other]
min_workers = 0
idle_unload_s = 30
[models.other.versions.v1]
spec = "sim"
load_s = 1
"""
ADDED = FILE + """
[models.third]
min_workers = 0
[models.third.versions.v1]
spec = "sim"
load_s = 1
"""
GUARDED = FILE.replace("max_workers = 3",
                       'max_workers = 3\npre = ["other"]\non_guard_failure = "open"')
WORKERS = 3


class Admin:
    """The admin API over a world of WORKERS workers, counting the owner's turns taken for
    a change (`CoreOwner.change`: the change applied with the turn's clock)."""

    def __init__(self, path: Path | None = None, text: str = FILE) -> None:
        self.world = World(parse_catalogue(text), WORKERS)
        self.woken = 0
        self.api = ModelsAdmin(self.world.cores, self, WORKERS,
                               None if path is None else str(path), self.wake)

    def now(self) -> float:
        return self.world.now

    def wake(self, apply: Callable[[float], None]) -> None:
        self.woken += 1
        self.world.change(apply)

    def call(self, method: str, name: str | None = None, version: str | None = None,
             body: Any = None) -> tuple[int, dict[str, Any]]:
        raw = body if isinstance(body, bytes) else b"" if body is None else orjson.dumps(body)
        return self.api.call(method, name, version, raw)

    @property
    def catalogue(self) -> Catalogue:
        return self.world.cores.catalogue

    def model(self, name: str) -> dict[str, Any]:
        _, view = self.call("GET")
        return next(m for m in view["models"] if m["name"] == name)


def refused(answer: tuple[int, dict[str, Any]], status: int, code: str) -> str:
    got, body = answer
    assert (got, body["error"]["code"]) == (status, code), body
    return str(body["error"]["message"])


# -- GET -----------------------------------------------------------------------------------

def test_get_shows_each_models_settings_and_each_versions_state() -> None:
    admin = Admin()
    status, view = admin.call("GET")
    assert status == 200 and [m["name"] for m in view["models"]] == ["topics", "other"]
    topics = view["models"][0]
    assert {k: v for k, v in topics.items() if k != "versions"} == {
        "name": "topics", "default": "v1", "serving_default": "v1", "weights": {},
        "min_workers": 1, "max_workers": 3, "idle_unload_s": 600.0, "pre": [], "post": [],
        "guard_mode": "sequential", "on_guard_failure": {"paid": "closed", "free": "closed"},
        "guard_timeout_ms": 300.0, "with_input": False, "set_by_admin": []}
    assert topics["versions"] == [
        {"version": "v1", "spec": "sim", "state": "resident", "resident_workers": 2,
         "loading": 0, "queued": 0, "load_s": None, "load_s_hint": 2.0, "start": "spawn",
         "start_s": {}, "retired_by_admin": False},
        {"version": "v2", "spec": "sim", "state": "cold", "resident_workers": 0,
         "loading": 0, "queued": 0, "load_s": None, "load_s_hint": None, "start": "spawn",
         "start_s": {}, "retired_by_admin": False}]
    assert admin.api.states() == {"topics@v1": "resident", "topics@v2": "cold",
                                  "other@v1": "resident"}
    assert orjson.loads(orjson.dumps(view)) == view  # plain values: it crosses the link


def test_get_shows_a_load_under_way_and_what_it_measured() -> None:
    admin = Admin()
    admin.world.run(25.0)  # past topics' residency: a worker may switch
    assert isinstance(admin.world.submit("topics@v2", 3, timeout=60.0), list)  # no hint: 30 s
    (v2,) = [v for v in admin.model("topics")["versions"] if v["version"] == "v2"]
    assert (v2["state"], v2["loading"], v2["queued"]) == ("loading", 1, 3)
    admin.world.run(admin.world.now + 1.0)
    (v2,) = [v for v in admin.model("topics")["versions"] if v["version"] == "v2"]
    assert v2["state"] == "resident" and 0 < v2["load_s"] <= 1.0


# -- PUT -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "shown"), [
    ({"weights": {"v1": 90, "v2": 10}}, {"weights": {"v1": 90, "v2": 10}}),
    ({"min_workers": 2}, {"min_workers": 2}),
    ({"max_workers": 2}, {"max_workers": 2}),
    ({"min_workers": 0, "max_workers": 1}, {"min_workers": 0, "max_workers": 1}),
    ({"default": "v2"}, {"default": "v2", "serving_default": "v1"}),  # until v2 is resident
])
def test_put_changes_a_models_settings_at_once(body: dict[str, Any],
                                               shown: dict[str, Any]) -> None:
    admin = Admin()
    status, view = admin.call("PUT", "topics", body=body)
    topics = next(m for m in view["models"] if m["name"] == "topics")
    assert status == 200 and {k: topics[k] for k in shown} == shown
    assert admin.woken == 1 and admin.model("topics") == topics


def test_weights_set_by_put_choose_the_version_of_a_request_naming_none() -> None:
    admin = Admin()
    admin.call("PUT", "topics", body={"weights": {"v2": 100, "v1": 0}})
    assert admin.world.cores.resolve("topics", "key-1") == "topics@v2"
    admin.call("PUT", "topics", body={"weights": {}})
    assert admin.world.cores.resolve("topics", "key-1") == "topics@v1"


@pytest.mark.parametrize("body", [
    b"{not json", b"\xff\xfe", b"[]", b'"v2"', b"{}", b"",
    orjson.dumps({"spec": "os:system"}), orjson.dumps({"default": "v2", "load_s": 1}),
], ids=repr)
def test_put_of_a_body_that_is_no_change_is_an_invalid_request(body: bytes) -> None:
    admin = Admin()
    before = admin.catalogue
    refused(admin.call("PUT", "topics", body=body), 400, "invalid_request")
    assert admin.catalogue is before and admin.woken == 0


@pytest.mark.parametrize("body", [
    {"default": "v9"}, {"default": 2}, {"weights": {"v1": 50}},
    {"weights": {"v1": 50, "v9": 50}}, {"weights": {"v1": "90", "v2": 10}},
    {"weights": {"v1": -5, "v2": 105}}, {"weights": ["v1"]}, {"min_workers": -1},
    {"min_workers": True}, {"min_workers": 4}, {"max_workers": 0}, {"max_workers": 1.5},
    {"min_workers": 3, "max_workers": 2},
], ids=repr)
def test_put_of_a_change_the_catalogue_cannot_take_is_refused_and_changes_nothing(
        body: dict[str, Any]) -> None:
    admin = Admin()
    before = admin.catalogue
    message = refused(admin.call("PUT", "topics", body=body), 422, "invalid_change")
    assert "models" in message  # it names where
    assert admin.catalogue is before and admin.woken == 0


def test_put_of_min_workers_the_pool_cannot_keep_says_so() -> None:
    admin = Admin()
    message = refused(admin.call("PUT", "other", body={"min_workers": 3}), 422,
                      "invalid_change")
    assert "more than the pool's 3 workers" in message
    assert admin.call("PUT", "other", body={"min_workers": 2})[0] == 200  # 1 + 2 fit


def test_put_of_min_workers_that_leave_another_model_no_worker_ever_is_refused() -> None:
    """The issue's: topics' floor at the pool's size would leave `other` (min_workers 0) no
    worker for good, told "loading" on every try."""
    admin = Admin()
    message = refused(admin.call("PUT", "topics", body={"min_workers": 3}), 422,
                      "invalid_change")
    assert message.startswith("models.other.min_workers: other@v1 could never get a worker")
    assert admin.woken == 0


def test_put_of_an_unknown_model_is_not_found() -> None:
    admin = Admin()
    refused(admin.call("PUT", "nope", body={"min_workers": 0}), 404, "not_found")


# -- DELETE --------------------------------------------------------------------------------

def test_delete_retires_a_version_it_then_takes_no_request() -> None:
    admin = Admin()
    admin.call("PUT", "topics", body={"weights": {"v1": 100, "v2": 0}})
    status, view = admin.call("DELETE", "topics", "v2")
    topics = next(m for m in view["models"] if m["name"] == "topics")
    assert status == 200 and topics["weights"] == {"v1": 100}
    assert [v["state"] for v in topics["versions"]] == ["resident", "retired"]
    assert "topics@v2" not in admin.catalogue.versions()
    assert admin.woken == 2
    assert admin.call("DELETE", "topics", "v2") == (200, view)  # again: the same


def test_delete_of_a_version_with_weight_is_refused_until_its_weight_is_0() -> None:
    admin = Admin()
    admin.call("PUT", "topics", body={"weights": {"v1": 90, "v2": 10}})
    message = refused(admin.call("DELETE", "topics", "v2"), 409, "version_serving")
    assert 'weight to 0 first (PUT /admin/models/topics {"weights":{"v1":100}})' in message
    assert "topics@v2" in admin.catalogue.versions() and admin.woken == 1


def test_delete_of_the_version_that_still_serves_the_default_waits_for_the_rollout() -> None:
    """README's sequence: the old default serves until the new one is resident; retired
    before, every request would wait for a version nobody loaded."""
    admin = Admin()
    admin.call("PUT", "topics", body={"default": "v2"})
    message = refused(admin.call("DELETE", "topics", "v1"), 409, "version_serving")
    assert "rollout to v2 has not taken over" in message and admin.woken == 1
    for _ in range(60):  # virtual seconds: past v1's residency, v2 loads and takes over
        if admin.model("topics")["serving_default"] == "v2":
            break
        admin.world.run(admin.world.now + 1.0)
    assert admin.call("DELETE", "topics", "v1")[0] == 200


def test_delete_of_the_default_or_of_nothing_is_refused() -> None:
    admin = Admin()
    message = refused(admin.call("DELETE", "topics", "v1"), 422, "invalid_change")
    assert "default" in message
    refused(admin.call("DELETE", "nope", "v1"), 404, "not_found")
    refused(admin.call("DELETE", "topics", "v9"), 404, "not_found")
    assert admin.woken == 0


def test_delete_of_the_overrides_serves_the_models_file_again() -> None:
    admin = Admin()
    admin.call("PUT", "topics", body={"weights": {"v1": 100, "v2": 0}, "max_workers": 2})
    assert admin.call("DELETE", "topics", "v2")[0] == 200
    status, view = admin.call("DELETE", "topics")
    topics = next(m for m in view["models"] if m["name"] == "topics")
    assert status == 200 and (topics["weights"], topics["max_workers"]) == ({}, 3)
    assert topics["set_by_admin"] == []
    (v2,) = [v for v in topics["versions"] if v["version"] == "v2"]
    assert (v2["state"], v2["retired_by_admin"]) == ("cold", False)
    assert "topics@v2" in admin.catalogue.versions()
    assert admin.call("DELETE", "topics") == (200, view)  # again: the same


def test_delete_of_the_overrides_of_an_unknown_model_is_not_found() -> None:
    admin = Admin()
    refused(admin.call("DELETE", "nope"), 404, "not_found")
    assert admin.woken == 0


@pytest.mark.parametrize(("method", "name", "version"), [
    ("POST", "topics", None), ("PUT", "topics", "v1"), ("DELETE", None, None),
    ("PUT", None, None), ("PATCH", "topics", None),
])
def test_other_methods_and_paths_are_not_allowed(method: str, name: str | None,
                                                 version: str | None) -> None:
    refused(Admin().call(method, name, version, {"min_workers": 0}), 405, "method_not_allowed")


def test_get_shows_a_models_guards_and_put_keeps_them() -> None:
    admin = Admin(text=GUARDED)
    topics = admin.model("topics")
    assert (topics["pre"], topics["on_guard_failure"]) == (["other"], {"paid": "open",
                                                                       "free": "open"})
    assert admin.call("PUT", "topics", body={"min_workers": 0})[0] == 200
    assert admin.catalogue.models["topics"].pre == ("other",)
    assert admin.model("topics")["pre"] == ["other"] and admin.catalogue.is_guard("other")


# -- SIGHUP --------------------------------------------------------------------------------

def test_reload_serves_the_file_as_it_is_now(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "models.toml"
    path.write_text(FILE)
    admin = Admin(path)
    path.write_text(ADDED)
    with caplog.at_level(logging.INFO, "batchgate.models"):
        admin.api.reload()
    assert [m["name"] for m in admin.call("GET")[1]["models"]] == ["topics", "other", "third"]
    assert admin.woken == 1 and "third@v1" in caplog.text
    assert admin.world.cores.resolve("third", None) == "third@v1"


@pytest.mark.parametrize("text", [
    "[models.topics\n", FILE.replace('default = "v1"', 'default = "v9"'),
    FILE.replace("min_workers = 0", "min_workers = 3"), FILE + "\nextra = 1\n", None,
    FILE.replace('spec = "sim"\nload_s = 2', 'spec = "minilm"\nload_s = 2'),
    FILE.replace("max_workers = 3", "max_workers = 3\nmin_workers = 3"),
], ids=["toml", "default", "over the pool", "unknown key", "missing", "spec changed",
        "unplaceable"])
def test_a_file_that_fails_to_load_changes_nothing_and_says_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str | None) -> None:
    path = tmp_path / "models.toml"
    path.write_text(FILE)
    admin = Admin(path)
    before = admin.catalogue
    if text is None:
        path.unlink()
    else:
        path.write_text(text)
    with caplog.at_level(logging.ERROR, "batchgate.models"):
        admin.api.reload()
    assert admin.catalogue is before and admin.woken == 0
    (record,) = caplog.records
    assert record.levelno == logging.ERROR and "nothing changed" in record.getMessage()
    assert str(path) in record.getMessage()


def test_reload_without_a_file_does_nothing() -> None:
    admin = Admin()
    before = admin.catalogue
    admin.api.reload()
    assert admin.catalogue is before and admin.woken == 0


def test_a_file_without_a_guard_still_named_changes_nothing_and_says_which(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "models.toml"
    path.write_text(GUARDED)
    admin = Admin(path, GUARDED)
    before = admin.catalogue
    path.write_text(GUARDED.split("[models.other]")[0])
    with caplog.at_level(logging.ERROR, "batchgate.models"):
        admin.api.reload()
    assert admin.catalogue is before and admin.woken == 0
    assert "models.topics.pre[0]: 'other' is no model of this catalogue" in caplog.text
