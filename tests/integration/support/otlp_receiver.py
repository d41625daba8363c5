"""Real OTLP receivers for tests, HTTP and gRPC: they decode requests with the official
opentelemetry-proto (and its generated gRPC services), as a collector does."""
from __future__ import annotations

import gzip
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest, ExportMetricsServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)

_SIGNALS = {
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
}


class OtlpReceiver:
    """A minimal OTLP/HTTP (protobuf) collector on 127.0.0.1; ``delay`` makes every request slow;
    ``port``: a given one (to come back where a collector was down), else a free one."""

    protocol = "http/protobuf"

    def __init__(self, delay: float = 0.0, port: int = 0) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.requests: dict[str, list] = {p: [] for p in _SIGNALS}
        self.bad: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                enc = (self.headers.get("Content-Encoding") or "").lower()
                if enc == "gzip":
                    body = gzip.decompress(body)
                elif enc == "deflate":
                    body = zlib.decompress(body)
                if receiver.delay:
                    time.sleep(receiver.delay)
                kinds = _SIGNALS.get(self.path)
                if kinds is None:
                    receiver.bad.append(self.path)
                    self.send_response(404)
                    self.end_headers()
                    return
                req = kinds[0]()
                req.ParseFromString(body)
                with receiver.lock:
                    receiver.requests[self.path].append(req)
                out = kinds[1]().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()

    def got(self, path: str) -> list:
        with self.lock:
            return list(self.requests[path])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class OtlpGrpcReceiver:
    """The same over gRPC (OTLP/gRPC, the collector's port 4317 protocol), with the same
    ``delay``, ``port``, ``url``, ``got(path)`` and ``close()``; requests are filed under the HTTP
    paths of their signal."""

    protocol = "grpc"

    def __init__(self, delay: float = 0.0, port: int = 0) -> None:
        # why: grpcio comes with the [grpc] extra; only the gRPC tests need it
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        self.lock = threading.Lock()
        self.requests: dict[str, list] = {p: [] for p in _SIGNALS}
        self.bad: list[str] = []
        receiver = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 - the generated service's name
                time.sleep(delay)
                with receiver.lock:
                    receiver.requests["/v1/traces"].append(request)
                return ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):  # noqa: N802
                time.sleep(delay)
                with receiver.lock:
                    receiver.requests["/v1/metrics"].append(request)
                return ExportMetricsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        bound = self.server.add_insecure_port(f"127.0.0.1:{port}")
        if not bound:
            raise OSError(f"cannot bind 127.0.0.1:{port}")
        self.url = f"http://127.0.0.1:{bound}"
        self.server.start()

    def got(self, path: str) -> list:
        with self.lock:
            return list(self.requests[path])

    def close(self) -> None:
        self.server.stop(grace=None).wait(5)


def attrs(kvs) -> dict:
    out = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


def spans_of(reqs) -> list[tuple[dict, object]]:
    """(resource attributes, span) for every span received."""
    return [(attrs(rs.resource.attributes), span)
            for req in reqs for rs in req.resource_spans for ss in rs.scope_spans for span in ss.spans]


def metrics_of(reqs) -> list[tuple[dict, object]]:
    return [(attrs(rm.resource.attributes), m)
            for req in reqs for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


def points_of(metric) -> list:
    """The data points of a received metric, whatever its type (gauge, sum, histogram)."""
    return list(getattr(metric, metric.WhichOneof("data")).data_points)


def value_of(point) -> float:
    return getattr(point, point.WhichOneof("value"))
