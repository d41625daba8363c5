"""Text generation with a small GPT-2 (random weights, built from a config: no download), instrumented.

    python examples/generate_gpt2.py [--out DIR] [--new-tokens N]

Prints the per-layer summary and the operations report, and writes ``gpt2-memory.png`` (the
4-panel plot), ``gpt2-capture.speedscope.json`` (a deep capture of the first generation steps; open
it at https://www.speedscope.app) and ``gpt2-timeline.json`` (``memprof-otel analyze`` reads it).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

import memprof_otel as mp


def build_model(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=4, n_embd=256, n_head=4)
    return GPT2LMHeadModel(config).eval()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for the PNG, speedscope and timeline files")
    ap.add_argument("--new-tokens", type=int, default=24, help="tokens generated per prompt")
    ap.add_argument("--batches", type=int, default=3, help="generate() calls")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    mp.start_monitoring({"sampler": {"interval": "50ms"}})
    mp.mark_operation("load")
    model = build_model()
    # exact attribution of every forward: an example, not production (default budget: 0.2 %)
    h = mp.instrument(model, name="gpt2", every_n_forwards=1, overhead_budget=1.0)
    capture = h.capture(forwards=3)  # the prompt's forward and the first two decoding steps
    mp.end_phase()  # from here on, each generate() call is its own operation
    gen = torch.Generator().manual_seed(0)
    for i in range(args.batches):
        batch = 2 ** i  # 1, 2, 4 prompts: memory grows with the batch
        prompt = torch.randint(0, model.config.vocab_size, (batch, 16), generator=gen)
        with mp.operation("generate", batch_size=batch), torch.inference_mode():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                 pad_token_id=model.config.eos_token_id)
        print(f"generate #{i + 1}: batch {batch}, {out.shape[1] - prompt.shape[1]} new tokens each")
    time.sleep(0.2)  # one more sampler tick after the last operation

    print()
    print(h.summary())
    print()
    print(mp.report())
    png = os.path.join(args.out, "gpt2-memory.png")
    speedscope = os.path.join(args.out, "gpt2-capture.speedscope.json")
    timeline = os.path.join(args.out, "gpt2-timeline.json")
    if not capture.wait(10.0):
        print("the capture did not complete", file=sys.stderr)
        return 1
    h.export_speedscope(speedscope)
    h.export_timeline(timeline)
    mp.plot(png)
    print(f"\nwrote {png}, {speedscope}, {timeline}")
    h.uninstrument()
    mp.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
