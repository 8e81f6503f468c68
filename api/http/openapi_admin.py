"""The admin API's part of the OpenAPI document: the workers and cell processes, the
catalogue of models and the changes it takes (each answers only with an admin key)."""

from __future__ import annotations

from api.http.openapi_schema import (
    JSON,
    JsonObject,
    error_answer,
    json_object,
    operation,
    string,
)
from api.http.parsing import MODEL_NAME

NAME = MODEL_NAME.pattern.partition("(")[0]  # a model's or a version's name
VERSION_STATES = ["resident", "loading", "cold", "retired"]

WORKER_FIELDS: dict[str, type | tuple[type, None]] = {
    "id": int, "slot": int, "pid": (int, None), "state": str, "device": str, "batches": int,
    "restarts": int, "node": str, "version": str,
}
"""`gpu_pool.WorkerInfo` as `/admin/workers` shows it, written out: a gateway serves this
document without loading the pool. A test holds it to the dataclass's fields."""
WORKER_STATES = ["pending", "starting", "switching", "ready", "busy", "dead", "stopped"]
# "pending": a Ray actor waiting for a node with room (`--pool ray`)
CAPACITY = {
    "desired": "the workers the pool aims at: the scaler's last decision within "
               "--workers MIN:MAX, or a fixed pool's size",
    "starting": "workers asked for and not up yet (each counted once, whatever its tries)",
    "running": "workers up: ready, busy or switching versions",
}
"""What `/admin/workers` says of the pool's size beside its workers (`api.metrics`
`pool_capacity` for a fixed pool)."""


def worker_schema() -> JsonObject:
    kinds = {int: "integer", str: "string"}
    props: JsonObject = {}
    for name, kind in WORKER_FIELDS.items():
        if isinstance(kind, tuple):  # X | None
            props[name] = {"type": [kinds[kind[0]], "null"]}
        else:
            props[name] = string() if kind is str else {"type": kinds[kind]}
    props["state"]["enum"] = WORKER_STATES
    return json_object(props, list(WORKER_FIELDS))


def admin_workers() -> JsonObject:
    processes = ["starting", "running", "restarting", "stopped"]
    gateway = json_object({"slot": {"type": "integer"}, "pid": {"type": ["integer", "null"]},
                           "state": {"type": "string", "enum": processes},
                           "restarts": {"type": "integer"}},
                          ["slot", "pid", "state", "restarts"])
    core = json_object({"pid": {"type": ["integer", "null"]},
                        "state": {"type": "string", "enum": processes},
                        "restarts": {"type": "integer"}, "incarnation": {"type": "integer"}},
                       ["pid", "state", "restarts", "incarnation"])
    body = json_object({
        "workers": {"type": "array", "items": {"$ref": "#/components/schemas/Worker"}},
        **{name: {"type": "integer", "minimum": 0, "description": what}
           for name, what in CAPACITY.items()},
        "gateways": {"type": "array", "items": gateway,
                     "description": "the HTTP gateway processes (--gateways K); empty in a "
                                    "single process"},
        "core": {"oneOf": [core, {"type": "null"}],
                 "description": "the core process of a cell, which its supervisor "
                                "restarts; null in a single process"}},
        ["workers", *CAPACITY, "gateways", "core"])
    return _admin("each worker of the pool, the workers it aims at, and a cell's gateway and "
                  "core processes", body)


MODELS_REF = {"$ref": "#/components/schemas/Models"}
MODELS_EXAMPLE = {"models": [{
    "name": "topics", "default": "v2", "serving_default": "v1", "weights": {},
    "min_workers": 1, "max_workers": 4, "idle_unload_s": 600.0, "set_by_admin": ["default"],
    "pre": ["safety"], "post": [], "guard_mode": "sequential",
    "on_guard_failure": {"paid": "closed", "free": "closed"}, "guard_timeout_ms": 300,
    "with_input": False,
    "versions": [
        {"version": "v1", "spec": "minilm", "state": "resident", "resident_workers": 2,
         "loading": 0, "queued": 3, "load_s": 0.24, "load_s_hint": None, "start": "fork",
         "start_s": {"spawn": 5.8, "fork": 0.24}, "retired_by_admin": False},
        {"version": "v2", "spec": "mypkg.topics_v2:batchstring", "state": "loading",
         "resident_workers": 0, "loading": 1, "queued": 0, "load_s": None,
         "load_s_hint": 40.0, "start": "fork", "start_s": {}, "retired_by_admin": False}]}]}


def guard_keys() -> JsonObject:
    """A model's guard stages, as the models file says them (docs/guards.md)."""
    names = {"type": "array", "items": string()}
    mode = {"type": "string", "enum": ["closed", "open"]}
    return {
        "pre": {**names, "description": "guard models run on each input before it"},
        "post": {**names, "description": "guard models run on each output after it"},
        "guard_mode": {"type": "string", "enum": ["sequential", "parallel"]},
        "on_guard_failure": {"type": "object", "properties": {"paid": mode, "free": mode},
                             "description": "per tier: what an input whose guard cannot "
                             "answer gets"},
        "guard_timeout_ms": {"type": "number", "description": "a guard's share of the "
                             "deadline"},
        "with_input": {"type": "boolean", "description": "as a post guard, it reads "
                       "{\"input\", \"output\"}"},
    }


def models_schema() -> JsonObject:
    maybe = {"type": ["number", "null"]}
    version = json_object({
        "version": string(), "spec": string(),
        "state": {"type": "string", "enum": VERSION_STATES},
        "resident_workers": {"type": "integer"}, "loading": {"type": "integer"},
        "queued": {"type": "integer"},
        "load_s": {**maybe, "description": "measured time of the kind of start it would get "
                   "now (null: none yet)"},
        "load_s_hint": {**maybe, "description": "the catalogue's hint"},
        "start": {"type": ["string", "null"], "enum": ["spawn", "fork", "wake", None],
                  "description": "the kind of start a worker of it would get now: spawned, "
                  "forked from the launcher, or a parked one woken (null: never asked)"},
        "start_s": {"type": "object", "additionalProperties": {"type": "number"},
                    "description": "measured seconds of its starts, by kind"},
        "retired_by_admin": {"type": "boolean", "description": "retired by the admin API, "
                             "not by the file (kept across reloads and restarts)"}},
        ["version", "spec", "state", "resident_workers", "loading", "queued", "load_s",
         "load_s_hint", "start", "start_s", "retired_by_admin"])
    model = json_object({
        "name": string(), "default": string(),
        "serving_default": {"type": ["string", "null"], "description": "the version a "
                            "request without @version gets now: the old default until a "
                            "new one is resident (or the rollout timeout passed)"},
        "weights": {"type": "object", "additionalProperties": {"type": "integer"}},
        "min_workers": {"type": "integer"}, "max_workers": {"type": ["integer", "null"]},
        "idle_unload_s": {"type": "number"}, "versions": {"type": "array", "items": version},
        "set_by_admin": {"type": "array", "items": {"type": "string", "enum": ["default", "weights",
                                            "min_workers", "max_workers"]},
                         "description": "the settings the admin API set, over the file's"},
        **guard_keys()},
        ["name", "default", "serving_default", "weights", "min_workers", "max_workers",
         "idle_unload_s", "versions", "set_by_admin", *guard_keys()])
    refused = json_object({"file": string(), "reason": string()}, ["file", "reason"])
    return json_object({
        "models": {"type": "array", "items": model},
        "refused_files": {"type": "array", "items": refused, "description": "in a cell, "
                          "the models or keys files on disk its last reading refused: it "
                          "serves the copies accepted before them"}}, ["models"])


def model_change_schema() -> JsonObject:
    out = json_object({
        "default": {"type": "string", "pattern": f"^{NAME}$",
                    "description": "a live version of the model: takes traffic once as "
                                   "warm as the old one"},
        "weights": {"type": "object", "additionalProperties": {"type": "integer",
                    "minimum": 0}, "propertyNames": {"pattern": f"^{NAME}$"},
                    "description": "percent per live version, adding up to 100; {} "
                                   "removes them"},
        "min_workers": {"type": "integer", "minimum": 0},
        "max_workers": {"type": "integer", "minimum": 1}})
    return {**out, "minProperties": 1, "additionalProperties": False,
            "description": "the settings to change; the others stay as they are"}


def _admin(what: str, body: JsonObject, codes: dict[int, tuple[str, ...]] | None = None,
           example: JsonObject | None = None, path: tuple[str, ...] = ()) -> JsonObject:
    """An admin operation answering `body`, or the errors of `codes` (status -> codes);
    `path`: its path parameters (a model's name, a version's)."""
    out = operation(what, body)
    if path:
        out["parameters"] = [{"name": name, "in": "path", "required": True, "schema": string(),
                              "description": f"the {'model' if name == 'name' else name}",
                              "examples": {"one": {"value": "topics" if name == "name"
                                                   else "v1"}}} for name in path]
    if example is not None:
        out["responses"]["200"]["content"][JSON]["examples"] = {"one": {"value": example}}
    out["security"] = [{"adminKey": []}]
    for status, only in {401: ("unauthorized",), **(codes or {})}.items():
        out["responses"][str(status)] = error_answer(status, only=only)
    return out


def admin_models() -> JsonObject:
    return _admin("each model and version: state, workers, queue, load time, weights",
                  MODELS_REF, example=MODELS_EXAMPLE)


def admin_change() -> JsonObject:
    out = _admin("change a model's default, weights or worker bounds (only versions the "
                 "catalogue names; a change that leaves it invalid changes nothing)",
                 MODELS_REF, {400: ("invalid_request",), 404: ("not_found",),
                              413: ("body_too_large",), 422: ("invalid_change",),
                              503: ("change_not_kept",)},
                 path=("name",))
    out["requestBody"] = {"required": True, "content": {JSON: {
        "schema": {"$ref": "#/components/schemas/ModelChange"},
        "examples": {"rollout": {"summary": "a new default", "value": {"default": "v2"}},
                     "canary": {"summary": "a split",
                                "value": {"weights": {"v1": 90, "v2": 10}}}}}}}
    return out


def admin_retire() -> JsonObject:
    return _admin("retire a version: no new requests, its queue finishes, then it is "
                  "unloaded (never the default, nor a version that still serves traffic)",
                  MODELS_REF, {404: ("not_found",), 409: ("version_serving",),
                               422: ("invalid_change",), 503: ("change_not_kept",)},
                  path=("name", "version"))


def admin_forget() -> JsonObject:
    return _admin("drop every change the admin API made to a model (its settings, the "
                  "versions it retired): the models file's are served again; a version "
                  "brought back is cold until asked for",
                  MODELS_REF, {404: ("not_found",), 422: ("invalid_change",),
                               503: ("change_not_kept",)},
                  path=("name",))


__all__ = ["CAPACITY", "MODELS_EXAMPLE", "VERSION_STATES", "WORKER_FIELDS", "WORKER_STATES",
           "admin_change", "admin_forget", "admin_models", "admin_retire", "admin_workers",
           "model_change_schema", "models_schema", "worker_schema"]
