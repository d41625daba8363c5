"""What a one-forward deep capture costs: the captured forward, the speedscope build, the store.

    python -m benchmarks.capture_cost              # GPT-2 prefill and MiniLM batch (~4 min on 2 cores)
    python -m benchmarks.capture_cost --quick      # fewer pairs and captures (smoke run; noisy)

Per model (GPT-2-small shape built from ``GPT2Config()``, random weights, prefill of 1x128 tokens;
MiniLM-L6 with real weights, a batch of 8x128 tokens), instrumented with the shipped config:

1. **Captured forward vs plain forward**, paired alternating blocks on the same model object (plain =
   instrumentation paused; captured = ``h.capture(forwards=1)``, the forward, ``cap.wait``), plus an
   A/A control (paused vs paused). Median of per-pair ratios and ratio of totals.
2. **After the forward**, on fresh captures, each timed separately: ``Capture.speedscope()`` (build
   the document), ``json.dumps`` of it (the encoding alone), ``DumpStore.save`` (encode + write +
   fsync + rotate, into a fresh folder next to the default dump folder) and the whole
   ``DumpService.store_capture`` (build + save + OTel spans) that ``POST /v1/dumps`` runs.
   Every figure is also given as a ratio to the plain forward time measured in step 1.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import memprof_otel as mp  # noqa: E402
from memprof_otel.dumps.store import DumpStore  # noqa: E402
from memprof_otel.runtime import runtime  # noqa: E402

from ._paired import paired  # noqa: E402
from .overhead import gpt2, gpt2_workloads, minilm, minilm_workloads  # noqa: E402

# model -> (builder, workloads, workload key, pairs, block)
PLAN: dict[str, tuple[Callable[[], torch.nn.Module], Callable[..., dict[str, Callable[[], None]]], str, int, int]] = {
    "gpt2": (gpt2, gpt2_workloads, "prefill (1x128 tokens)", 30, 2),
    "minilm": (minilm, minilm_workloads, "batch (8x128 tokens)", 30, 3),
}


def _fs_type(path: str) -> str:
    best, fs = "", "?"
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and path.startswith(parts[1]) and len(parts[1]) > len(best):
                    best, fs = parts[1], parts[2]
    except OSError:
        pass
    return f"{fs} ({best})"


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def run_model(name: str, quick: bool, captures: int, dump_dir: str) -> list[dict[str, Any]]:
    build, workloads, wl, pairs, block = PLAN[name]
    if quick:
        pairs = max(4, pairs // 5)
    model = build()
    fn = workloads(model)[wl]
    h = mp.instrument(model, name=f"capture-{name}")
    last: list[Any] = [None]

    def plain() -> None:
        h.pause()
        fn()

    def plain_too() -> None:  # a distinct object: paired() keys its timings by function
        h.pause()
        fn()

    def captured() -> None:
        h.resume()
        cap = h.capture(forwards=1)
        fn()
        if not cap.wait(60):
            raise RuntimeError("capture did not complete")
        last[0] = cap

    out = []
    plain_s = None
    with torch.inference_mode():
        for mode, inst in (("aa-control", plain_too), ("capture", captured)):
            r = paired(f"{name} {wl} [{mode}]", plain, inst, pairs=pairs, block=block)
            print(r.row(), flush=True)
            out.append({"name": r.name, "mode": mode, "plain_ms": r.plain_s * 1e3,
                        "median_overhead": r.median_overhead, "total_overhead": r.total_overhead,
                        "iqr": [r.ci_low - 1, r.ci_high - 1], "pairs": r.pairs, "block": r.block})
            if mode == "capture":
                plain_s = r.plain_s

        # the document: build, encode, store, each on a fresh capture
        store = DumpStore(dump_dir)
        build_s, encode_s, save_s, service_s = [], [], [], []
        sizes: dict[str, Any] = {}
        for i in range(captures):
            captured()
            cap = last[0]
            t0 = time.perf_counter()
            doc = cap.speedscope()
            build_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            body = json.dumps(doc, separators=(",", ":")).encode()
            encode_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            store.save(doc, kind="speedscope", model=h.name)
            save_s.append(time.perf_counter() - t0)
            captured()
            cap2 = last[0]
            t0 = time.perf_counter()
            runtime().dump_service.store_capture(h.name, cap2, reason="bench")
            service_s.append(time.perf_counter() - t0)
            if i == 0:
                sizes = {"stacks": len(cap.allocations), "call_events": len(cap.calls),
                         "frames": len(doc["shared"]["frames"]), "samples": len(doc["profiles"][0]["samples"]),
                         "bytes_allocated": cap.total_bytes(), "document_bytes": len(body)}
    h.uninstrument()
    assert plain_s is not None
    doc_row = {"name": f"{name} {wl} [document]", "mode": "document", "plain_ms": plain_s * 1e3,
               "captures": captures, **sizes,
               "speedscope_build_ms": med(build_s) * 1e3, "json_encode_ms": med(encode_s) * 1e3,
               "store_save_ms": med(save_s) * 1e3, "store_capture_ms": med(service_s) * 1e3,
               "speedscope_build_ratio": med(build_s) / plain_s, "store_save_ratio": med(save_s) / plain_s,
               "store_capture_ratio": med(service_s) / plain_s}
    cap_row = out[-1]
    doc_row["end_to_end_ratio"] = (1 + cap_row["median_overhead"]) + doc_row["store_capture_ratio"]
    print(f"  {sizes.get('stacks', 0):,} stacks recorded, {sizes.get('call_events', 0):,} call "
          f"events, {sizes.get('frames', 0):,} frames, {sizes.get('samples', 0):,} samples, document "
          f"{sizes.get('document_bytes', 0) / 1024:,.0f} KiB")
    print(f"  speedscope() {doc_row['speedscope_build_ms']:.2f} ms (x{doc_row['speedscope_build_ratio']:.3f} of a plain "
          f"forward) | json.dumps {doc_row['json_encode_ms']:.2f} ms | DumpStore.save {doc_row['store_save_ms']:.2f} ms "
          f"(x{doc_row['store_save_ratio']:.3f}) | store_capture {doc_row['store_capture_ms']:.2f} ms "
          f"(x{doc_row['store_capture_ratio']:.3f}) | captured forward + store_capture = "
          f"x{doc_row['end_to_end_ratio']:.3f} of a plain forward  ({captures} captures, medians)", flush=True)
    out.append(doc_row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer pairs and captures (smoke run)")
    ap.add_argument("--models", default="gpt2,minilm")
    ap.add_argument("--captures", type=int, help="captures for the document timings (default 10, quick 3)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    captures = args.captures or (3 if args.quick else 10)
    base = tempfile.mkdtemp(prefix="memprof-bench-dumps-")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus, "
          f"{platform.machine()}, python {sys.version.split()[0]}, memprof_otel {mp.__version__}, "
          f"load {os.getloadavg()[0]:.2f}; dumps in {base} on {_fs_type(base)}")
    mp.start_monitoring({"dumps": {"dir": os.path.join(base, "service")}})
    results: list[dict[str, Any]] = []
    try:
        for name in args.models.split(","):
            results += run_model(name, args.quick, captures, os.path.join(base, "store"))
    finally:
        mp.shutdown()
        shutil.rmtree(base, ignore_errors=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
