"""Whether a catalogue can be placed on a pool: what start-up, SIGHUP and the admin API
refuse, and which versions a request is told can never get a worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from failover import ModelUnplaceable
from failover.fleet import (
    CatalogueError,
    ModelCores,
    check_fits,
    load_catalogue,
    parse_catalogue,
    unreachable,
)
from failover.fleet.catalogue import Catalogue
from tests.failover.fleet.driver import World

EXAMPLE = Path(__file__).parents[3] / "examples" / "models.toml"


def two_models(a_min: int = 1, b_min: int = 0, b_max: str = "", weights: str = "") -> Catalogue:
    return parse_catalogue(f"""
[models.a]
min_workers = {a_min}
[models.a.versions.v1]
spec = "sim"
[models.b]
default = "v1"
min_workers = {b_min}
{b_max}
{weights}
[models.b.versions.v1]
spec = "sim"
[models.b.versions.v2]
spec = "sim"
""")


def test_min_workers_over_the_pool_are_refused_the_first_model_counting_one() -> None:
    with pytest.raises(CatalogueError, match=r"min_workers add up to 3 \(a 1, b 2"):
        check_fits(two_models(b_min=2), 2)
    with pytest.raises(CatalogueError, match=r"add up to 2 \(a 1, b 1; the first model"):
        check_fits(two_models(a_min=0, b_min=1), 1)
    check_fits(two_models(b_min=2), 3)


def test_a_model_with_no_floor_on_a_pool_its_others_floors_fill_is_refused() -> None:
    """The issue's PUT: a's min_workers raised to the pool's size leaves b no worker ever."""
    with pytest.raises(CatalogueError, match=r"^models\.b\.min_workers: b@v1 could never get "
                                             r"a worker: b has min_workers 0 and the models' "
                                             r"min_workers \(a 2, b 0\) hold all 2"):
        check_fits(two_models(a_min=2), 2)
    check_fits(two_models(a_min=2), 2, 3)  # a pool that grows to 3 has one to move
    check_fits(two_models(a_min=1), 2)


def test_a_weighted_version_a_locked_model_cannot_reach_is_refused() -> None:
    canary = 'weights = { v1 = 90, v2 = 10 }'
    with pytest.raises(CatalogueError, match=r"^models\.b\.weights\.v2: b@v2 could never get"):
        check_fits(two_models(b_min=1, weights=canary), 2)
    with pytest.raises(CatalogueError, match=r"b's max_workers equals its min_workers"):
        check_fits(two_models(b_min=1, b_max="max_workers = 1", weights=canary), 3)
    check_fits(two_models(b_min=1, weights=canary), 3)


def test_versions_only_a_request_naming_them_reaches_are_listed_not_refused() -> None:
    locked = two_models(b_min=1)
    check_fits(locked, 2)
    assert list(unreachable(locked, 2)) == ["b@v2"]
    assert unreachable(locked, 3) == {}


def test_max_workers_that_leave_a_worker_with_no_model_are_refused() -> None:
    with pytest.raises(CatalogueError, match=r"max_workers add up to 2, fewer than the pool's 3"):
        check_fits(two_models(b_max="max_workers = 1").with_settings("a", max_workers=1), 3)


def test_the_shipped_example_needs_the_workers_it_says() -> None:
    example = load_catalogue(EXAMPLE)
    with pytest.raises(CatalogueError, match=r"could never get a worker"):
        check_fits(example, 1)
    check_fits(example, 2)
    assert "--workers 2" in EXAMPLE.read_text()


class Pooled(World):
    """A world whose cores know the pool's largest size (as the service's do)."""

    def build_cores(self) -> ModelCores:
        return ModelCores(self.catalogue, self.make_core, self.spy, backoff=self.backoff,
                          most=self.slots_n)


def test_a_request_for_a_version_no_placement_can_serve_is_refused_at_once() -> None:
    """Both workers are held at their models' floors: b@v2 is never loaded, and its
    request is told so, with no load promised, not "loading" on every try."""
    world = Pooled(two_models(b_min=1), 2)
    world.run(30.0)
    refused = world.submit("b@v2", timeout=60.0)
    assert isinstance(refused, ModelUnplaceable) and "loading" not in str(refused)
    assert "min_workers (a 1, b 1) hold all 2" in str(refused)
    assert isinstance(world.submit("b", timeout=5.0), list)  # b's default serves


def test_a_version_a_spare_worker_can_reach_is_loaded_not_refused() -> None:
    world = Pooled(two_models(b_min=1), 3)
    world.run(30.0)
    assert isinstance(world.submit("b@v2", timeout=60.0), list)
