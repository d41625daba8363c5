"""Child of test_budget_page_cache.py, run inside a memory cgroup the test made, on the shipped
defaults: a small instrumented model, then a file of FILE_MIB written, synced and read twice (its
pages then on the cgroup's active file list, as a server's libraries and the files it reads are),
then the capacity budget asked, then as many bytes as it called available allocated and touched.
One JSON record per line on stdout, flushed, so the parent knows how far it got."""
import json, os, sys
import torch
import memprof_otel as mp
from tests import cgroup_truth

MIB = 1 << 20
FILE_MIB = 384


def say(**kw):
    sys.stdout.write(json.dumps(kw) + "\n"); sys.stdout.flush()


def main():
    path = sys.argv[1]
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).eval()
    h = mp.instrument(model, name="small")
    with torch.no_grad():
        model(torch.randn(4, 64))
    d, version = cgroup_truth.memory_dir()
    files_before = cgroup_truth.file_bytes(d, version)
    chunk = os.urandom(MIB)
    with open(path, "wb") as f:
        for _ in range(FILE_MIB):
            f.write(chunk)
        f.flush(); os.fsync(f.fileno())
    for _ in range(2):  # a second read moves the pages to the active list (the working set keeps those)
        with open(path, "rb") as f:
            while f.read(8 * MIB):
                pass
    usage = cgroup_truth.usage_bytes(d, version)
    files = cgroup_truth.file_bytes(d, version)
    inactive = cgroup_truth.inactive_file_bytes(d, version)
    budget = h.headroom()["budget"]
    say(phase="asked", budget=budget, usage=usage, file_bytes=files, file_grew=files - files_before,
        working_set=usage - inactive)
    n = max(0, budget["available_bytes"])
    block = torch.empty(n, dtype=torch.uint8)
    block.fill_(1)  # every page touched: resident, charged to the cgroup
    say(phase="held", bytes=n, sum=int(block[:: 4096].sum()))


if __name__ == "__main__":
    main()
