"""What every-forward attribution of a Keras model on the JAX backend costs on CPU, where the
counter sums the sizes of ``jax.live_arrays()`` at every layer boundary: so its cost grows with the
number of arrays alive in the process, not with the model's work.

    KERAS_BACKEND=jax python -m benchmarks.jax_counter_cost           # in the JAX venv (.venv-jax)
    KERAS_BACKEND=jax python -m benchmarks.jax_counter_cost --quick   # fewer pairs (smoke run; noisy)

A Sequential of ``--layers`` Dense(64) layers (batch 32) runs eagerly, in paired, interleaved
blocks (``_paired.paired``) on one model object, with ``--extra`` more small arrays held alive
beside it (other models' weights, caches: what a real process keeps). Variants, per extra count:

* ``aa-control``: plain against plain (this machine's noise floor);
* ``every-forward``: instrumented (``every_n_forwards=1``, ``overhead_budget=1.0``) against plain;
* ``default``: instrumented as shipped (forwards attributed under the scheduler's overhead budget)
  against plain.

Each row also gives the extra time per forward divided by the counter reads one forward makes
(two per layer call: its entry and its exit), and the median time of one ``read_and_reset`` alone.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import memprof_otel as mp  # noqa: E402
from benchmarks._paired import paired, paused, running  # noqa: E402
from memprof_otel.sources.jax_memory import JaxMemoryCounter  # noqa: E402


def _read_cost(reads: int = 200) -> float:
    c = JaxMemoryCounter()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reads):
            c.read_and_reset()
        runs.append((time.perf_counter() - t0) / reads)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--extra", default="0,1000,10000")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    assert keras.backend.backend() == "jax", "set KERAS_BACKEND=jax before running"
    pairs, block = (6, 3) if args.quick else (20, 5)
    model = keras.Sequential([keras.Input((64,)), *[keras.layers.Dense(64) for _ in range(args.layers)]])
    x = jax.numpy.asarray(np.ones((32, 64), "float32"))
    model(x).block_until_ready()
    every = mp.instrument(model, name="bench", every_n_forwards=1, overhead_budget=1.0)

    def forward() -> None:
        model(x).block_until_ready()

    reads = 2 * (args.layers + 1)  # every tracked layer and the root: a read at entry and at exit
    print(f"jax {jax.__version__}, keras {keras.__version__}, {os.cpu_count()} CPUs, "
          f"{args.layers} Dense(64) layers, batch 32, {reads} reads a forward")
    held: list[object] = []
    for extra in [int(e) for e in args.extra.split(",")]:
        held.clear()
        held.extend(jax.numpy.full((4,), i, "float32") for i in range(extra))
        live = len(jax.live_arrays())
        h = every
        aa = paired(f"aa-control +{extra}", paused(h, forward), paused(h, forward), pairs=pairs, block=block)
        ev = paired(f"every-forward +{extra}", paused(h, forward), running(h, forward), pairs=pairs, block=block)
        per_read = ev.plain_s * (ev.median_ratio - 1.0) / reads
        print(aa.row())
        print(ev.row())
        print(f"  live arrays {live}: extra per read (from the median) {per_read * 1e6:.1f} us; "
              f"one read_and_reset alone {_read_cost() * 1e6:.1f} us", flush=True)
        # as shipped: a handle of its own on the same model (one handle a model at a time)
        every.uninstrument()
        h = mp.instrument(model, name="bench-default")
        print(paired(f"default +{extra}", paused(h, forward), running(h, forward), pairs=pairs,
                     block=block).row())
        st = h.status()
        print(f"  forwards {st['forwards']}, attributed {st['attributed_forwards']}", flush=True)
        h.uninstrument()
        every = mp.instrument(model, name="bench", every_n_forwards=1, overhead_budget=1.0)
    every.uninstrument()
    mp.shutdown(5)


if __name__ == "__main__":
    main()
