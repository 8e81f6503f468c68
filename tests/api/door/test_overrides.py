"""The admin's changes kept over the models file (`Overrides`), through the admin API over
real cores in virtual time: they last across a re-read of the file (SIGHUP) and a core that
starts again from the same file, and the file wins a setting it changes itself."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson
import pytest

from api.config import Settings, Workers
from api.door.models import ModelsAdmin
from api.door.overrides import SUFFIX, Overrides
from api.door.service import laid_over
from failover.fleet.catalogue import NotInCatalogue, load_catalogue
from tests.api.door.test_models_admin import FILE, WORKERS, refused
from tests.failover.fleet.driver import World


class Served:
    """A core serving the file in `folder` with the changes kept beside it, as a core that
    starts (or starts again) does."""

    def __init__(self, folder: Path, text: str | None = None) -> None:
        self.path = folder / "models.toml"
        if text is not None:
            self.path.write_text(text)
        self.overrides = Overrides.beside(str(self.path))
        self.world = World(self.overrides.apply(load_catalogue(self.path)), WORKERS)
        self.api = ModelsAdmin(self.world.cores, self, WORKERS, str(self.path),
                               self.world.change, overrides=self.overrides)

    def now(self) -> float:
        return self.world.now

    def call(self, method: str, name: str, version: str | None = None,
             body: Any = None) -> tuple[int, dict[str, Any]]:
        return self.api.call(method, name, version, b"" if body is None else orjson.dumps(body))

    def model(self, name: str) -> dict[str, Any]:
        return next(m for m in self.api.view()["models"] if m["name"] == name)

    def version(self, name: str, version: str) -> dict[str, Any]:
        return next(v for v in self.model(name)["versions"] if v["version"] == version)


def test_a_version_retired_by_the_admin_stays_retired_across_a_reload(tmp_path: Path) -> None:
    served = Served(tmp_path, FILE)
    assert served.call("DELETE", "topics", "v2")[0] == 200
    served.api.reload()  # the file as it was: v2 live there
    assert served.version("topics", "v2")["state"] == "retired"
    assert served.version("topics", "v2")["retired_by_admin"] is True
    assert served.version("topics", "v1")["retired_by_admin"] is False
    with pytest.raises(NotInCatalogue):
        served.world.cores.catalogue.resolve("topics@v2")


def test_a_core_that_starts_again_serves_the_admins_changes_over_the_file(
    tmp_path: Path,
) -> None:
    served = Served(tmp_path, FILE)
    assert served.call("PUT", "topics", body={"min_workers": 2, "max_workers": 2})[0] == 200
    assert served.call("DELETE", "topics", "v2")[0] == 200
    again = Served(tmp_path)  # the same file, a new core
    topics = again.model("topics")
    assert (topics["min_workers"], topics["max_workers"]) == (2, 2)
    assert topics["set_by_admin"] == ["min_workers", "max_workers"]
    assert [v["state"] == "retired" for v in topics["versions"]] == [False, True]
    assert again.model("other")["set_by_admin"] == []


def test_the_file_wins_a_setting_it_changes_and_the_admins_others_stay(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    served = Served(tmp_path, FILE)
    assert served.call("PUT", "topics", body={"max_workers": 2, "default": "v2"})[0] == 200
    served.path.write_text(FILE.replace("max_workers = 3", "max_workers = 1"))
    with caplog.at_level(logging.WARNING, logger="batchgate.models"):
        served.api.reload()
    topics = served.model("topics")
    assert (topics["max_workers"], topics["default"]) == (1, "v2")
    assert topics["set_by_admin"] == ["default"]
    assert "topics.max_workers: the file changed it" in caplog.text
    assert Served(tmp_path).model("topics")["set_by_admin"] == ["default"]  # kept so


def test_an_override_of_a_version_the_file_removes_is_dropped_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    served = Served(tmp_path, FILE)
    assert served.call("DELETE", "topics", "v2")[0] == 200
    served.path.write_text(FILE.replace('[models.topics.versions.v2]\nspec = "sim"\n', ""))
    with caplog.at_level(logging.WARNING, logger="batchgate.models"):
        served.api.reload()
    assert [v["version"] for v in served.model("topics")["versions"]] == ["v1"]
    assert "topics.versions.v2: the file no longer has version v2" in caplog.text
    kept = orjson.loads((tmp_path / ("models.toml" + SUFFIX)).read_bytes())
    assert kept["retired"] == {}
    served.path.write_text(FILE)  # v2 back in the file: a new version, live
    served.api.reload()
    assert served.version("topics", "v2")["state"] != "retired"


def test_a_setting_put_back_to_the_files_value_is_the_files_again(tmp_path: Path) -> None:
    served = Served(tmp_path, FILE)
    assert served.call("PUT", "topics", body={"max_workers": 2})[0] == 200
    assert served.model("topics")["set_by_admin"] == ["max_workers"]
    assert served.call("PUT", "topics", body={"max_workers": 3})[0] == 200
    assert served.model("topics")["set_by_admin"] == []
    served.path.write_text(FILE.replace("max_workers = 3", "max_workers = 2"))
    served.api.reload()
    assert served.model("topics")["max_workers"] == 2  # the file's, now


def test_the_overrides_dropped_are_dropped_from_the_kept_file_too(tmp_path: Path) -> None:
    served = Served(tmp_path, FILE)
    assert served.call("PUT", "topics", body={"max_workers": 2})[0] == 200
    assert served.call("DELETE", "topics", "v2")[0] == 200
    assert served.call("PUT", "other", body={"min_workers": 1})[0] == 200
    assert served.call("DELETE", "topics")[0] == 200
    kept = orjson.loads((tmp_path / ("models.toml" + SUFFIX)).read_bytes())
    assert (kept["retired"], list(kept["settings"])) == ({}, ["other"])
    again = Served(tmp_path)  # a core that starts again: the file's topics, the admin's other
    assert again.model("topics")["max_workers"] == 3
    assert again.version("topics", "v2")["retired_by_admin"] is False
    assert again.model("other")["set_by_admin"] == ["min_workers"]


def test_overrides_that_cannot_be_dropped_from_the_kept_file_stay(tmp_path: Path) -> None:
    served = Served(tmp_path, FILE)
    assert served.call("DELETE", "topics", "v2")[0] == 200
    (tmp_path / ("models.toml" + SUFFIX + ".new")).mkdir()  # where it is written first
    before = served.world.cores.catalogue
    message = refused(served.call("DELETE", "topics"), 503, "change_not_kept")
    assert "nothing changed" in message
    assert served.world.cores.catalogue is before
    assert served.version("topics", "v2")["retired_by_admin"] is True


def test_a_change_that_cannot_be_kept_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    served = Served(tmp_path, FILE)
    (tmp_path / ("models.toml" + SUFFIX + ".new")).mkdir()  # where it is written first
    before = served.world.cores.catalogue
    message = refused(served.call("DELETE", "topics", "v2"), 503, "change_not_kept")
    assert "nothing changed" in message
    assert served.world.cores.catalogue is before
    assert served.version("topics", "v2")["retired_by_admin"] is False


def test_a_kept_file_that_cannot_be_read_leaves_the_file_served_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    (tmp_path / ("models.toml" + SUFFIX)).write_text("{not json")
    with caplog.at_level(logging.ERROR, logger="batchgate.models"):
        served = Served(tmp_path, FILE)
    assert served.model("topics")["set_by_admin"] == []
    assert "cannot be read" in caplog.text


def test_changes_that_no_longer_fit_the_pool_at_start_are_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    served = Served(tmp_path, FILE)
    assert served.call("PUT", "other", body={"min_workers": 2})[0] == 200
    settings = Settings(models=str(served.path), workers=Workers(2))
    overrides = Overrides.beside(str(served.path))
    with caplog.at_level(logging.WARNING, logger="batchgate.models"):
        catalogue = laid_over(overrides, load_catalogue(served.path), settings)
    assert catalogue.models["other"].min_workers == 0
    assert "do not fit the pool" in caplog.text and overrides.set_by_admin("other") == []
