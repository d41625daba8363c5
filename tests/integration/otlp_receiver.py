"""A real OTLP/HTTP receiver for tests: decodes requests with the official opentelemetry-proto."""
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
    """A minimal OTLP/HTTP (protobuf) collector on 127.0.0.1; ``delay`` makes every request slow."""

    def __init__(self, delay: float = 0.0) -> None:
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

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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
