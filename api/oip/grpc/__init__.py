r"""The Open Inference Protocol's gRPC side (`--grpc-port`): the `inference.GRPCInferenceService`
server a single process and each gateway of a cell run beside HTTP (`api.oip.grpc_server`,
started by `api.oip.serving_grpc`), and how its tensors and statuses are read and written
(`api.oip.grpc_codec`). Importing the package loads nothing: grpcio (the `grpc` extra) is
loaded only where a port is given, and the generated modules import the package back.

`grpc_predict_v2.proto` is KServe's published protocol, unchanged (docs/predict-api/v2 of
github.com/kserve/kserve, commit aaac4e29); tritonclient.grpc speaks it (Triton's proto is a
superset: its other calls are answered UNIMPLEMENTED). The `grpc_predict_v2_pb2*` modules
are generated from it, from the repository's root, by:

    python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
        api/oip/grpc/grpc_predict_v2.proto \
    && sed -i 's/_descriptor_pool.Default()/_descriptor_pool.DescriptorPool()/' \
        api/oip/grpc/grpc_predict_v2_pb2.py \
    && sed -i '1i # ruff: noqa\n# mypy: ignore-errors' api/oip/grpc/grpc_predict_v2_pb2.py \
        api/oip/grpc/grpc_predict_v2_pb2.pyi api/oip/grpc/grpc_predict_v2_pb2_grpc.py

The first `sed` puts the messages in a descriptor pool of their own: tritonclient.grpc
registers the same names (`inference.ModelInferRequest`, ...) in protobuf's default pool,
and one process could not import both otherwise (a test suite, a gateway's own client).
The second keeps ruff and mypy off the generated code (mypy reads the `.pyi`). Made with
grpcio-tools 1.81.1 (protobuf 6.33.5): they need grpcio >= 1.81.1 and protobuf >= 6.33.5, < 7
at run time, and say so when imported beside older ones.
"""


__all__: list[str] = []
