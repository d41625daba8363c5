"""What instrumenting a Keras 3 model costs per forward, on the backend ``KERAS_BACKEND`` names
(torch, tensorflow or jax), on CPU, eager calls.

    KERAS_BACKEND=tensorflow python -m benchmarks.keras_overhead          # in the TF venv (.venv-tf)
    KERAS_BACKEND=jax python -m benchmarks.keras_overhead                 # in the JAX venv (.venv-jax)
    KERAS_BACKEND=torch python -m benchmarks.keras_overhead               # in the test venv (.venv)
    ... --quick                                                           # fewer pairs (smoke run; noisy)

Model: a Sequential holding a nested Sequential (the serving example's shape): Dense(1024) ->
[Dense(1024), ReLU, Dense(1024)] x ``--blocks`` -> Dense(16), batch ``--batch`` rows of 512 floats,
called eagerly (``model(x)``, converted to NumPy so the work is done before the clock stops).
Paired, interleaved blocks on one model object (``_paired.paired``). Variants:

* ``aa-control``: plain against plain (this machine's noise floor);
* ``every-forward``: instrumented with ``every_n_forwards=1, overhead_budget=1.0`` against plain:
  what a forward with per-layer figures costs;
* ``default``: instrumented as shipped (forwards attributed under the scheduler's overhead budget)
  against plain: what a server pays.
"""
from __future__ import annotations

import argparse
import os

import keras
import numpy as np

import memprof_otel as mp
from benchmarks._paired import paired, paused, running


def build(blocks: int) -> keras.Model:
    inner = [keras.Sequential([keras.layers.Dense(1024, name="fc1"), keras.layers.ReLU(name="act"),
                               keras.layers.Dense(1024, name="fc2")], name=f"block{i}") for i in range(blocks)]
    return keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024, name="encoder"), *inner,
                             keras.layers.Dense(16, name="head")], name="mlp")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    pairs, block = (6, 3) if args.quick else (20, 5)
    model = build(args.blocks)
    x = keras.ops.convert_to_tensor(np.random.default_rng(0).standard_normal((args.batch, 512)).astype("float32"))

    def forward() -> None:
        keras.ops.convert_to_numpy(model(x))

    forward()
    layers = 2 + 4 * args.blocks  # encoder, head, each block and its three layers
    print(f"keras {keras.__version__}, backend {keras.backend.backend()}, {os.cpu_count()} CPUs, "
          f"{layers} layers + the root, batch {args.batch}", flush=True)
    every = mp.instrument(model, name="bench", every_n_forwards=1, overhead_budget=1.0)
    print(paired("aa-control", paused(every, forward), paused(every, forward), pairs=pairs, block=block).row())
    print(paired("every-forward", paused(every, forward), running(every, forward), pairs=pairs, block=block).row())
    print(f"  method: {every.summary_dict()['method']}", flush=True)
    every.uninstrument()
    h = mp.instrument(model, name="bench-default")  # as shipped: one handle a model at a time
    print(paired("default", paused(h, forward), running(h, forward), pairs=pairs, block=block).row())
    st = h.status()
    print(f"  forwards {st['forwards']}, attributed {st['attributed_forwards']}", flush=True)
    h.uninstrument()
    mp.shutdown(5)


if __name__ == "__main__":
    main()
