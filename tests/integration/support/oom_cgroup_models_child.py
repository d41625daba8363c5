"""Child of test_oom_cgroup_models.py, run inside a memory cgroup the test made, on the shipped
defaults (``instrument(model)``): a GPT-2 (4 layers, 256 wide) served only through ``generate()``
(prompts of batch 1-16 x 32-256 tokens, 4 new tokens each) or a ViT (4 layers, 256 wide, eager
attention, 224 px) on batches of 1-32 images. Traffic in random order, a pass at a time, until the
max-safe-batch table answers (at the longest prompt for GPT-2; at most 120 s); then that batch,
asked again three times (each answer run, as a server's gate would), then 1.25x, 1.3x, 1.5x, 2x, 4x
and 8x the latest answer until the kernel kills it. (The largest batch of the traffic is an eighth of
the answer or more: the table answers up to ``capacity.max_extrapolation``, 8x, the shapes seen.) One JSON record per line on stdout, flushed,
so the parent knows how far it got."""
import json, random, sys, time
import torch
import memprof_otel as mp

AGAIN = 3  # answers asked again after the first, each run as the batch it names


def say(**kw):
    sys.stdout.write(json.dumps(kw, default=str) + "\n"); sys.stdout.flush()

def figures(doc):
    """What an answer rested on, for the parent's messages: the budget's in-use and available bytes,
    the allowance and the reuse credit, and the process's resident memory now (MiB)."""
    b = doc.get("budget") or {}
    rss = next((int(l.split()[1]) >> 10 for l in open("/proc/self/status") if l.startswith("VmRSS:")), None)
    return {"in_use_mib": (b.get("in_use_bytes") or 0) >> 20, "available_mib": (b.get("available_bytes") or 0) >> 20,
            "gap_ratio": doc.get("gap_ratio"), "credit_mib": (doc.get("reuse_credit_bytes") or 0) >> 20, "rss_mib": rss}

def main():
    kind = sys.argv[1]
    torch.manual_seed(0)
    rnd = random.Random(2)
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        m = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=5000, n_positions=512)).eval()
        h = mp.instrument(m, name="gpt2")
        shapes = [(b, s) for s in (32, 64, 128, 256) for b in (1, 2, 4, 8, 16)]
        def run(b, s):
            m.generate(torch.randint(0, 5000, (b, s)), attention_mask=torch.ones(b, s, dtype=torch.long),
                       max_new_tokens=4, do_sample=False, pad_token_id=0)
        LONG = 256
    else:
        from transformers import ViTConfig, ViTModel
        m = ViTModel(ViTConfig(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                               image_size=224, patch_size=16, attn_implementation="eager")).eval()
        h = mp.instrument(m, name="vit")
        shapes = [(b, 224) for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)]
        def run(b, s):
            m(pixel_values=torch.randn(b, 3, 224, 224))
        LONG = None
    t0, safe, n = time.monotonic(), None, 0
    with torch.no_grad():
        while safe is None and time.monotonic() - t0 < 120:
            rnd.shuffle(shapes)
            for b, s in shapes:
                run(b, s); n += 1
            h.capacity.kernel.states(force=True); h.capacity.model.states(force=True)
            doc = h.headroom()
            msb = doc.get("max_safe_batch") or {}
            safe = msb.get(str(LONG)) if LONG else (msb.get("any") or next(iter(msb.values()), None))
        doc = h.headroom()
        say(phase="asked", safe=safe, learnt_s=round(time.monotonic()-t0, 1), calls=n, msb=doc.get("max_safe_batch"),
            reason=doc.get("max_safe_batch_reason"), table_call=doc.get("table_call"), budget=doc["budget"]["available_bytes"],
            heap=doc.get("heap"), gap_bytes=doc.get("gap_bytes"),
            fits_far=h.fits(batch=2000, **({"seq_len": LONG} if LONG else {})), **figures(doc))
        if not safe:
            return
        run(safe, LONG); say(phase="ran", batch=safe, called_safe=True)
        for _ in range(AGAIN):  # a server's gate: ask again after the traffic, run what it names
            h.capacity.kernel.states(force=True); h.capacity.model.states(force=True)
            doc = h.headroom()
            msb = doc.get("max_safe_batch") or {}
            safe = msb.get(str(LONG)) if LONG else (msb.get("any") or next(iter(msb.values()), None))
            say(phase="again", safe=safe, **figures(doc))
            if not safe:
                return
            run(safe, LONG); say(phase="ran", batch=safe, called_safe=True)
        for f in (1.25, 1.3, 1.5, 2.0, 4.0, 8.0):
            b = int(safe * f); say(phase="trying", batch=b); run(b, LONG); say(phase="ran", batch=b)

if __name__ == "__main__":
    main()
