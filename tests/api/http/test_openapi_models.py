"""The document of several models held to what serves them: `/admin/models` as the admin
API really answers it, a change's schema against what the admin API takes, `/readyz`'s
`models`, and the answer's `model`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from api.config import DEFAULT_TIERS, Settings, Workers
from api.door import Service
from api.door.models import ModelsAdmin
from api.http import Limits, document
from api.http.openapi import ANSWER_EXAMPLES, MODELS_EXAMPLE
from api.metrics import Metrics
from tests.api.door.fakes import FakePool

DOC = document(Limits(max_inputs=7, max_input_chars=20, max_body_bytes=1 << 20))
SCHEMAS = DOC["components"]["schemas"]
CATALOGUE = """
[models.topics]
default = "v1"
max_workers = 2
[models.topics.versions.v1]
spec = "tests.models_versions:v1"
load_s = 3
[models.topics.versions.v2]
spec = "tests.models_versions:v2"
[models.other]
min_workers = 0
[models.other.versions.v1]
spec = "tests.models_versions:v2"
"""


def valid(schema: dict[str, Any], value: Any) -> bool:
    return bool(jsonschema.Draft202012Validator(schema).is_valid(value))


@pytest.fixture
def admin(tmp_path: Path) -> ModelsAdmin:
    """The admin API over a service of two models (its pool never started)."""
    (tmp_path / "models.toml").write_text(CATALOGUE)
    service = Service(Settings(models=str(tmp_path / "models.toml"), workers=Workers(2)), Metrics(),
                      DEFAULT_TIERS, pool=FakePool(2))
    return ModelsAdmin(service.models, service.clock, 2, None,
                       lambda apply: apply(service.clock.now()))


def test_what_the_admin_api_shows_is_what_the_document_says(admin: ModelsAdmin) -> None:
    assert valid(SCHEMAS["Models"], MODELS_EXAMPLE)
    status, shown = admin.call("GET", None, None, b"")
    assert status == 200 and valid(SCHEMAS["Models"], orjson.loads(orjson.dumps(shown)))
    status, changed = admin.call("PUT", "topics", None, b'{"weights": {"v1": 100, "v2": 0}}')
    assert status == 200 and valid(SCHEMAS["Models"], changed)
    status, retired = admin.call("DELETE", "topics", "v2", b"")  # no weight: it serves none
    assert status == 200 and valid(SCHEMAS["Models"], retired)


@pytest.mark.parametrize("body", [
    {"default": "v2"}, {"weights": {"v1": 90, "v2": 10}}, {"weights": {}},
    {"min_workers": 0}, {"max_workers": 2}, {"default": "v9"}, {"weights": {"v1": 50}},
    {}, {"spec": "os:system"}, {"default": 2}, {"min_workers": -1}, {"max_workers": 0},
    {"weights": {"v1": -5, "v2": 105}}, [], "v2",
], ids=repr)
def test_a_change_the_schema_takes_is_refused_only_for_the_catalogue_it_meets(
        admin: ModelsAdmin, body: Any) -> None:
    """Never a 400 for a body the schema takes (a 422 is the catalogue's state), never a
    200 for one it refuses."""
    status, _ = admin.call("PUT", "topics", None, orjson.dumps(body))
    if valid(SCHEMAS["ModelChange"], body):
        assert status in (200, 422)
    else:
        assert status in (400, 422)


def test_an_unknown_model_or_version_is_a_documented_404(admin: ModelsAdmin) -> None:
    documented = DOC["paths"]["/admin/models/{name}/versions/{version}"]["delete"]
    for name, version in (("nope", "v1"), ("topics", "v9")):
        status, body = admin.call("DELETE", name, version, b"")
        assert str(status) in documented["responses"] and body["error"]["code"] == "not_found"
    status, body = admin.call("DELETE", "topics", "v1", b"")  # the default
    assert status == 422 and body["error"]["code"] == "invalid_change"
    forget = DOC["paths"]["/admin/models/{name}/overrides"]["delete"]
    status, body = admin.call("DELETE", "nope", None, b"")
    assert str(status) in forget["responses"] and body["error"]["code"] == "not_found"
    status, view = admin.call("DELETE", "topics", None, b"")
    assert status == 200 and valid(SCHEMAS["Models"], view)


def test_readyz_names_each_versions_state(admin: ModelsAdmin) -> None:
    schema = DOC["paths"]["/readyz"]["get"]["responses"]["200"]["content"][
        "application/json"]["schema"]
    states = admin.states()
    body = {"ready": True, "workers_ready": 2, "draining": False, "models": states}
    assert valid(schema, body) and set(states) == {"topics@v1", "topics@v2", "other@v1"}
    assert not valid(schema, {**body, "models": {"topics@v1": "asleep"}})


def test_every_answer_names_the_version_that_ran_it() -> None:
    for example in ANSWER_EXAMPLES.values():
        assert valid(SCHEMAS["Answer"], example["value"])
        assert not valid(SCHEMAS["Answer"], {
            k: v for k, v in example["value"].items() if k != "model"})
