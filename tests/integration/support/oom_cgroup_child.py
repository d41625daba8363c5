"""Child of test_oom_cgroup.py, run inside a memory cgroup the test made: a small BERT-shaped
encoder of its own (4 layers, 256 wide, 4 heads, eager attention: the scores are materialised),
mixed traffic (25 shapes, batch 1-8 x seq_len 64-512, each pass in a new random order) until the
capacity model names a safe batch at the long sequence length (at least one whole pass, at most
LEARN_S seconds); then that batch, then what the command line names: ``again`` asks once more
and runs the batch the answer names (a server whose gate asks before each request, its traffic at
the largest batch called safe), ``1.25x`` that share of the latest safe batch (rounded down),
which the parent expects the kernel to kill.

The first argument is the configuration: ``defaults`` (``instrument(model)`` as shipped: the
overhead budget; under the limit glibc's mmap threshold fixed at 1/128 of it) or ``off`` (the same
with ``capacity.mmap_threshold: off``: glibc's own malloc policy). Each line on stdout is one JSON record, flushed, so the parent
knows how far it got."""
from __future__ import annotations

import json
import math
import random
import sys
import time

import torch
from torch import nn

import memprof_otel as mp

WIDTH, HEADS, LAYERS, FFN, VOCAB = 256, 4, 4, 1024, 1000
LONG = 512
LEARN_S = 120.0  # the issue's bound: an answer within two minutes of mixed traffic
CONFIGS = {"defaults": {}, "off": {"capacity": {"mmap_threshold": "off"}}}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)
        self.norm1 = nn.LayerNorm(WIDTH)
        self.ffn = nn.Sequential(nn.Linear(WIDTH, FFN), nn.GELU(), nn.Linear(FFN, WIDTH))
        self.norm2 = nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(WIDTH // HEADS)  # eager: b*h*s*s floats
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, WIDTH)
        x = self.norm1(x + self.out(ctx))
        return self.norm2(x + self.ffn(x))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(LONG, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos(torch.arange(input_ids.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return x


def say(**kw: object) -> None:
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def main() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    h = mp.instrument(model, name="encoder", config=CONFIGS[sys.argv[1]])
    gen = torch.Generator().manual_seed(1)
    order = random.Random(2)
    shapes = [(b, s) for s in (64, 128, 256, 384, 512) for b in (1, 2, 4, 6, 8)]
    started, forwards, safe = time.monotonic(), 0, None
    with torch.no_grad():
        while safe is None and time.monotonic() - started < LEARN_S:
            order.shuffle(shapes)
            for b, s in shapes:
                model(torch.randint(0, VOCAB, (b, s), generator=gen))
                forwards += 1
            h.capacity.kernel.states(force=True)
            h.capacity.model.states(force=True)
            safe = h.headroom()["max_safe_batch"].get(str(LONG))
        learnt_s = time.monotonic() - started
        doc = h.headroom()
        st = h.status()
        say(phase="asked", safe=safe, unit=doc["unit"], unit_note=doc["unit_note"], budget=doc["budget"], heap=doc["heap"],
            gap_ratio=doc["gap_ratio"], gap_bytes=doc["gap_bytes"], credit=doc["reuse_credit_bytes"],
            error_ratio=doc["model_fit"]["error_ratio"], learnt_s=round(learnt_s, 1), forwards=forwards,
            attributed=st["attributed_forwards"], shapes=len(doc["shapes"]),
            row=next((r for r in doc.get("max_safe_batch_rows", []) if r["seq_len"] == LONG), None),
            fits_far=h.fits(batch=400, seq_len=LONG),
            predicted=h.predict_peak(batch=safe, seq_len=LONG).to_dict() if safe else None)
        if not safe:
            return
        model(torch.randint(0, VOCAB, (safe, LONG), generator=gen))
        say(phase="ran", batch=safe, called_safe=True)
        for arg in sys.argv[2:]:
            if arg == "again":  # a server's gate: ask again after the traffic, run what it names
                h.capacity.kernel.states(force=True)
                h.capacity.model.states(force=True)
                doc = h.headroom()
                safe = doc["max_safe_batch"].get(str(LONG))
                say(phase="again", safe=safe, gap_ratio=doc["gap_ratio"], credit=doc["reuse_credit_bytes"],
                    in_use=doc["budget"]["in_use_bytes"])
                if not safe:
                    return
                model(torch.randint(0, VOCAB, (safe, LONG), generator=gen))
                say(phase="ran", batch=safe, called_safe=True)
                continue
            b = int(safe * float(arg[:-1])) if arg.endswith("x") else int(arg)
            say(phase="trying", batch=b)
            model(torch.randint(0, VOCAB, (b, LONG), generator=gen))
            say(phase="ran", batch=b)


if __name__ == "__main__":
    main()
