"""A real inference server for a Keras 3 model, instrumented with memprof-otel, on any Keras backend.

    KERAS_BACKEND=tensorflow python examples/keras_server.py --traffic
    KERAS_BACKEND=jax        python examples/keras_server.py --traffic
    KERAS_BACKEND=torch      python examples/keras_server.py --traffic [--every-forward]

The model is built in code (no downloads): an MLP classifier over 256 features, a Sequential with a
nested Sequential, so its layer paths are ``encoder``, ``block``, ``block.fc1``, ``block.act``,
``block.fc2`` and ``head`` (the model itself is ``""``). Its activations are MiB-sized from a batch
of 64 rows. The app uses the standard library only (``http.server``): ``POST /predict
{"inputs": [[256 floats], ...]}`` -> ``{"outputs": [[10 class probabilities], ...]}``, ``GET
/healthz``. Bad input gets a 400 with ``{"error": ..., "detail": ...}``. Each request is one
``mp.operation("predict", model="keras-mlp")``. The memprof endpoint (``/metrics``, ``/v1/layers``,
``/v1/dumps``, ...) listens on its own port.

What to look at, with the server running:

    curl -s localhost:9464/metrics | grep memprof_layer              # per-layer peak/retained bytes
    curl -s localhost:9464/metrics | grep memprof_operation_duration  # the predict requests
    curl -s localhost:9464/v1/layers                                  # the same figures as JSON
    curl -s -X POST -H 'Content-Type: application/json' \\
         'localhost:9464/v1/dumps?model=keras-mlp&wait=30'            # a speedscope capture of one forward

The server calls the model eagerly (``model(x)``), not through a compiled ``predict()``: on the
TensorFlow and JAX backends only eager calls are measured per layer (inside a ``tf.function`` or
``jax.jit`` the layers run once, while tracing). Forwards run one at a time: on those backends the
figures are the device's allocator statistics, so two overlapping forwards could not be told apart
(they would be counted as unattributed). On JAX, eager ops are compiled once per input shape: the
first request of each batch size is slow (about half a second on CPU), later ones are not. By default the library samples forwards under its
overhead budget; ``--every-forward`` attributes every one (a demo's setting, not production's).
Settings come from ``MEMPROF_OTEL_*`` environment variables as usual (``MEMPROF_OTEL_HTTP_TOKEN``...).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import signal
import socket
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# keras picks its backend from KERAS_BACKEND when first imported; this script never imports
# torch, tensorflow or jax itself, so it runs wherever keras and one backend are installed
import keras
import numpy as np

import memprof_otel as mp

MODEL = "keras-mlp"
INPUT_WIDTH = 256
HIDDEN = 2048
CLASSES = 10
MAX_ROWS = 1024
# a full batch of MAX_ROWS rows as JSON text is ~6 MB; anything far larger is refused unread
MAX_BODY_BYTES = 16 << 20


# ---------------------------------------------------------------- the model

def build_model(seed: int = 0) -> keras.Model:
    """The MLP: ``encoder`` -> ``block`` (``fc1``, ``act``, ``fc2``) -> ``head`` (softmax).

    At batch 64, ``encoder``'s output is 0.5 MiB and ``block.fc1``'s 1 MiB (float32), so the
    per-layer figures are well above the allocators' small-block noise."""
    keras.utils.set_random_seed(seed)  # the same weights on every start: outputs are reproducible
    block = keras.Sequential([
        keras.layers.Dense(2 * HIDDEN, name="fc1"),
        keras.layers.ReLU(name="act"),
        keras.layers.Dense(HIDDEN, name="fc2"),
    ], name="block")
    model = keras.Sequential([
        keras.Input((INPUT_WIDTH,)),
        keras.layers.Dense(HIDDEN, activation="relu", name="encoder"),
        block,
        keras.layers.Dense(CLASSES, activation="softmax", name="head"),
    ], name="keras_mlp")
    # an inference server never trains: on the torch backend this also turns off autograd, which
    # would otherwise keep every activation alive for a backward pass that never comes
    model.trainable = False
    return model


class Predictor:
    """The model behind a lock; ``predict(rows)`` is one memprof operation."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        # one forward at a time: the TF and JAX figures are the whole device's, so overlapping
        # forwards cannot be attributed per layer; Keras models are not documented thread-safe either
        self.lock = threading.Lock()

    def _forward(self, x: np.ndarray) -> list[list[float]]:
        # an eager call, not model.predict(): see the module docstring
        y = self.model(x, training=False)
        return keras.ops.convert_to_numpy(y).tolist()

    def predict(self, x: np.ndarray) -> list[list[float]]:
        with self.lock:
            # inside the lock: the operation's duration and memory are this request's own
            with mp.operation("predict", model=MODEL, batch_size=int(x.shape[0])):
                return self._forward(x)

    def warmup(self) -> None:
        """One forward before serving: the backend's first call loads kernels and builds caches."""
        with self.lock:
            self._forward(np.zeros((2, INPUT_WIDTH), dtype=np.float32))


# ---------------------------------------------------------------- the app

class BadRequest(Exception):
    """Input the app refuses: the client's fault, answered with ``status`` and a JSON body."""

    def __init__(self, error: str, detail: str, status: int = 400) -> None:
        super().__init__(detail)
        self.error, self.detail, self.status = error, detail, status


def parse_inputs(body: bytes) -> np.ndarray:
    """``{"inputs": [[floats], ...]}`` -> a float32 array of shape (rows, INPUT_WIDTH), or BadRequest."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest("bad_json", f"the body is not JSON: {e}") from None
    if not isinstance(doc, dict) or "inputs" not in doc:
        raise BadRequest("bad_request", 'expected a JSON object {"inputs": [[floats], ...]}')
    rows = doc["inputs"]
    if not isinstance(rows, list) or not rows:
        raise BadRequest("bad_inputs", "inputs must be a non-empty list of rows")
    if len(rows) > MAX_ROWS:
        raise BadRequest("too_many_rows", f"at most {MAX_ROWS} rows a request, got {len(rows)}")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != INPUT_WIDTH:
            got = f"{len(row)} values" if isinstance(row, list) else type(row).__name__
            raise BadRequest("bad_width", f"row {i}: expected {INPUT_WIDTH} numbers, got {got}")
        # strict types: numpy would turn "1.5" or true into a float without a word
        for v in row:
            if type(v) not in (int, float) or not math.isfinite(v):
                raise BadRequest("bad_value", f"row {i}: every value must be a finite number, got {v!r}"[:200])
    return np.asarray(rows, dtype=np.float32)


def make_handler(predictor: Predictor) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: clients reuse their connection
        server_version = "keras-mlp-example"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass  # one line per request would drown the ready line and errors

        def _send(self, status: int, doc: Any) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/healthz":
                self._send(200, {"status": "ok", "model": MODEL})
            else:
                self._send(404, {"error": "not_found", "detail": f"no route GET {self.path[:100]}"})

        def do_POST(self) -> None:
            try:
                if self.path.split("?", 1)[0] != "/predict":
                    self._drain()
                    raise BadRequest("not_found", f"no route POST {self.path[:100]}", 404)
                x = parse_inputs(self._body())
                self._send(200, {"model": MODEL, "outputs": predictor.predict(x)})
            except BadRequest as e:
                self._send(e.status, {"error": e.error, "detail": e.detail})
            except Exception as e:  # a bug or a backend error: answer it, keep serving
                self._send(500, {"error": "internal", "detail": f"{type(e).__name__}: {e}"[:500]})

        def _body(self) -> bytes:
            raw = self.headers.get("Content-Length")
            if raw is None or not raw.strip().isdigit():
                self.close_connection = True  # the body's end is unknown: the connection cannot be reused
                raise BadRequest("bad_request", "a Content-Length header is required")
            n = int(raw)
            if n > MAX_BODY_BYTES:
                self.close_connection = True  # left unread
                raise BadRequest("too_large", f"the body is {n} bytes, at most {MAX_BODY_BYTES}", 413)
            return self.rfile.read(n)

        def _drain(self) -> None:
            try:
                self._body()
            except BadRequest:
                pass

    return Handler


class AppServer(ThreadingHTTPServer):
    daemon_threads = True  # a slow client never holds up shutdown
    allow_reuse_address = True

    def __init__(self, host: str, port: int, predictor: Predictor) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), make_handler(predictor))


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


# ---------------------------------------------------------------- synthetic traffic

class Traffic(threading.Thread):
    """Posts random batches of 64..256 rows to ``app_url/predict`` until ``stop()``."""

    def __init__(self, app_url: str, seed: int = 0, pause: tuple[float, float] = (0.05, 0.3)) -> None:
        super().__init__(name="synthetic-traffic", daemon=True)
        self.app_url, self.pause = app_url, pause
        self.rng = random.Random(seed)
        self._stop_event = threading.Event()
        self.sent = self.errors = 0

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        self.join(timeout)

    def _post(self, rows: int) -> None:
        inputs = [[self.rng.gauss(0.0, 1.0) for _ in range(INPUT_WIDTH)] for _ in range(rows)]
        req = urllib.request.Request(f"{self.app_url}/predict", data=json.dumps({"inputs": inputs}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - our own app
            r.read()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                self._post(self.rng.randint(64, 256))
                self.sent += 1
            except (urllib.error.URLError, OSError) as e:
                self.errors += 1
                if self.errors == 1:  # say it once: a demo without traffic shows little
                    print(f"synthetic traffic: POST /predict failed: {e!r} (retrying)", file=sys.stderr, flush=True)
            self._stop_event.wait(self.rng.uniform(*self.pause))


# ---------------------------------------------------------------- running

def run(host: str = "127.0.0.1", port: int = 9464, app_port: int = 8000, *, traffic: bool = False,
        every_forward: bool = False) -> int:
    """Serve until SIGINT/SIGTERM; returns 0 after a clean shutdown."""
    stop = threading.Event()
    # set before the slow parts (backend import is done, but building and warming up take
    # seconds): a SIGTERM during start-up still ends in a clean shutdown
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())

    endpoint = mp.serve(host=host, port=port)
    model = build_model()
    predictor = Predictor(model)
    # warm up before instrumenting: the first call's one-off allocations (kernels, caches) are
    # not a forward's need and would inflate the first figures
    predictor.warmup()
    # the library's default samples forwards under a small overhead budget; the flag measures every
    # forward, so the figures appear from the first request
    overrides: dict[str, Any] = {"every_n_forwards": 1, "overhead_budget": 1.0} if every_forward else {}
    h = mp.instrument(model, name=MODEL, **overrides)

    app = AppServer(host, app_port, predictor)
    serving = threading.Thread(target=app.serve_forever, kwargs={"poll_interval": 0.2}, name="keras-app",
                               daemon=True)
    serving.start()
    app_url = url_of(host, app.server_address[1])
    load = Traffic(app_url) if traffic else None
    if load is not None:
        load.start()
    print(f"ready app={app_url} memprof={endpoint.url} backend={keras.backend.backend()}", flush=True)
    try:
        while not stop.is_set():
            stop.wait(0.5)  # a timed wait: the signal handler runs between waits
    finally:
        if load is not None:
            load.stop()
        app.shutdown()  # no new requests; the ones in flight finish on their daemon threads
        app.server_close()
        serving.join(5.0)
        with predictor.lock:  # no forward running while the wrappers go
            h.uninstrument()
        mp.shutdown(3.0)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1", help="address of both servers")
    ap.add_argument("--port", type=int, default=9464, help="memprof endpoint port (/metrics, /v1/...)")
    ap.add_argument("--app-port", type=int, default=8000, help="the app's port (POST /predict)")
    ap.add_argument("--traffic", action="store_true", help="post random batches to /predict in the background")
    ap.add_argument("--every-forward", action="store_true",
                    help="attribute every forward (every_n_forwards=1, overhead_budget=1.0)")
    args = ap.parse_args(argv)
    return run(args.host, args.port, args.app_port, traffic=args.traffic, every_forward=args.every_forward)


if __name__ == "__main__":
    sys.exit(main())
