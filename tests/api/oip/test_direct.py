"""Which URLs `/v2`'s infer takes on the direct way (`api.oip.infer_call`): the infer routes
as the request line carries them; anything else, or a path ASGI must decode, stays ASGI's."""

from __future__ import annotations

import pytest

from api.oip import InferCall, infer_call


@pytest.mark.parametrize(("url", "model", "version"), [
    (b"/v2/models/topics/infer", "topics", None),
    (b"/v2/models/topics/versions/v2/infer", "topics", "v2"),
    (b"/v2/models/a.b-c_d/infer", "a.b-c_d", None),
])
def test_an_infer_url_names_its_model_and_version(url: bytes, model: str,
                                                  version: str | None) -> None:
    call = infer_call(url)
    assert isinstance(call, InferCall) and (call.model, call.version) == (model, version)


@pytest.mark.parametrize("url", [
    b"/v1/batchstring", b"/v2/models/topics", b"/v2/models/topics/ready",
    b"/v2/models/topics/infer?x=1", b"/v2/models/to%70ics/infer", b"/v2/models//infer",
    b"/v2/models/topics/versions//infer", b"/v2/models/a/b/infer", b"/v2/models/\xff/infer",
])
def test_anything_else_takes_asgis_way(url: bytes) -> None:
    assert infer_call(url) is None
