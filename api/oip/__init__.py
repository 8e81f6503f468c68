"""The Open Inference Protocol (KServe v2) in front of the same door as `/v1`: `infer`, the
one call both of its sides make (`api.oip.infer`), what its health and metadata calls
answer (`api.oip.meta`), its HTTP side's routes (`oip_routes`, `/v2`: `api.oip.http`, its
tensors `api.oip.tensors`) with its infer on the direct way as `/v1` (`infer_call`:
`api.oip.direct`), and its gRPC side (`serving_grpc`, `--grpc-port`: `api.oip.grpc_server`,
`api.oip.grpc_codec`, the generated code in `api.oip.grpc`)."""

from api.oip.direct import InferCall, infer_call
from api.oip.http import oip_routes
from api.oip.infer import SINGLE_MODEL, Inferred, infer, model_key
from api.oip.meta import (
    INPUT,
    OUTPUT,
    PLATFORM,
    REFUSED,
    SERVER,
    ModelView,
    model_view,
    server_ready,
)
from api.oip.serving import serving_grpc
from api.oip.tensors import InferRequest, decode_request, encode_answer

__all__ = [
    "INPUT",
    "OUTPUT",
    "PLATFORM",
    "REFUSED",
    "SERVER",
    "SINGLE_MODEL",
    "InferCall",
    "InferRequest",
    "Inferred",
    "ModelView",
    "decode_request",
    "encode_answer",
    "infer",
    "infer_call",
    "model_key",
    "model_view",
    "oip_routes",
    "server_ready",
    "serving_grpc",
]
