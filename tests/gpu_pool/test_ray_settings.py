"""What a Ray worker holds and where the pool finds its cluster: plain settings, no Ray."""

from __future__ import annotations

import pytest

from gpu_pool import PoolSettings, RayPoolSettings, parse_resources

BASE = PoolSettings(model="sim", workers=3)


def test_resources_are_names_with_an_amount_of_one_unless_given() -> None:
    assert parse_resources("GPU=1") == {"GPU": 1.0}
    assert parse_resources(" batchgate_slot , CPU=2") == {"batchgate_slot": 1.0, "CPU": 2.0}
    assert parse_resources("GPU=0.5") == {"GPU": 0.5}


@pytest.mark.parametrize("text", ["", "GPU=0", "GPU=-1", "GPU=many", "a b", "x,x"])
def test_a_bad_resource_list_says_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError, match=r"resource|name"):
        parse_resources(text)


def test_an_actor_holds_one_gpu_by_default_and_nothing_else() -> None:
    options = RayPoolSettings(BASE).actor_options()
    assert options == {"num_cpus": 0.0, "num_gpus": 1.0, "resources": {}}


def test_a_custom_resource_places_workers_and_a_local_ray_declares_room_for_all() -> None:
    settings = RayPoolSettings(BASE, resources={"batchgate_slot": 1.0, "CPU": 2.0})
    assert settings.actor_options() == {"num_cpus": 2.0, "num_gpus": 0.0,
                                        "resources": {"batchgate_slot": 1.0}}
    assert settings.local_resources() == {"batchgate_slot": 3.0}
    assert settings.threads == 2


def test_serve_builds_the_ray_pool_for_pool_ray() -> None:
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'batchgate[ray]'")
    from api.config import Settings
    from api.door import build_pool
    from gpu_pool.ray_pool import RayPool

    pool = build_pool(Settings(model="sim", pool="ray", ray_worker_resources="slot"))
    assert isinstance(pool, RayPool) and pool.state_counts()["pending"] == 1
