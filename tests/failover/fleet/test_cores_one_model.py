"""The state machine of `test_cores` over one model of three versions on two workers: every
rollout and retirement meets the model's floor, and the cores shrink to one (the path that
skips routing) and grow again as versions are retired, dropped from the file and re-read."""

from __future__ import annotations

from hypothesis import settings

from failover.fleet.catalogue import Catalogue
from tests.failover.fleet.test_cores import CATALOGUE, CoresMachine

ONE = Catalogue({"a": CATALOGUE.models["a"]})
ONLY_V1 = Catalogue.from_dict({"models": {"a": {
    **{k: v for k, v in ONE.to_dict()["models"]["a"].items() if k != "versions"},
    "versions": {"v1": ONE.to_dict()["models"]["a"]["versions"]["v1"]}}}})


class OneModelMachine(CoresMachine):
    files = (ONE, ONLY_V1)
    workers = 2


TestOneModel = OneModelMachine.TestCase
TestOneModel.settings = settings(max_examples=120, stateful_step_count=50, deadline=None)
