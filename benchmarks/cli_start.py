"""How long the ``memprof-otel`` command takes to start, against a bare ``python -c pass``.

    python -m benchmarks.cli_start            # 30 interleaved rounds (~1 min)
    python -m benchmarks.cli_start --quick    # 8 rounds (smoke run)

Each round runs every command once, in an order rotated from round to round (so no command always
runs right after another's page-cache warm-up), as a fresh process from the same interpreter. Two
identical ``python -c pass`` entries are the A/A control: the gap between their medians is the noise
floor of this machine. Reported: the median wall time of each command and its excess over the
first ``python -c pass``.

The commands:
- ``--version``: parse and print, nothing else;
- ``dump --url <closed port>``: an HTTP subcommand up to its first request, refused at once;
- ``headroom --url <live>`` and ``monitor --once --url <live>``: HTTP subcommands doing their whole
  job against a real endpoint this benchmark serves (a small instrumented model), so the figure
  includes one or two loopback round trips and the server's answer;
- ``import memprof_otel; memprof_otel.instrument``: what the Python API costs, torch included, for
  contrast (the CLI's HTTP subcommands do not pay it).
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time

import torch

import memprof_otel as mp


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli() -> list[str]:
    script = shutil.which("memprof-otel", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "memprof_otel.cli"]


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0, 1, 3):  # dump to a closed port exits 1; headroom may exit 3
        raise SystemExit(f"{cmd} exited {proc.returncode}: {proc.stderr.strip()}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rounds = 8 if args.quick else 30
    print(f"torch {torch.__version__}, {os.cpu_count()} cpus, {platform.machine()}, python "
          f"{sys.version.split()[0]}, memprof_otel {mp.__version__}; load average {os.getloadavg()[0]:.2f}")

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    h = mp.instrument(model, name="bench")
    with torch.no_grad():
        for b in (1, 2, 4, 8):
            model(torch.randn(b, 64))
    server = mp.serve(port=0)
    live = f"http://127.0.0.1:{server.port}"
    cli = _cli()
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "python -c pass (A/A)": [sys.executable, "-c", "pass"],
        "memprof-otel --version": [*cli, "--version"],
        "memprof-otel dump (refused)": [*cli, "dump", "--url", f"http://127.0.0.1:{_closed_port()}",
                                        "-o", os.devnull],
        "memprof-otel headroom (live)": [*cli, "headroom", "--url", live],
        "memprof-otel monitor --once (live)": [*cli, "monitor", "--once", "--url", live],
        "import memprof_otel; instrument": [sys.executable, "-c",
                                            "import memprof_otel; memprof_otel.instrument"],
    }
    names = list(commands)
    times: dict[str, list[float]] = {n: [] for n in names}
    try:
        for n in names:  # warm-up: page cache, .pyc files
            _wall(commands[n])
        for r in range(rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                times[n].append(_wall(commands[n]))
    finally:
        server.close()
        h.uninstrument()
    base = statistics.median(times[names[0]])
    print(f"\n{rounds} rounds, median wall time per start (excess over `python -c pass`):")
    for n in names:
        med = statistics.median(times[n])
        q = statistics.quantiles(times[n], n=4)
        print(f"  {n:<38} {med * 1e3:8.1f} ms   {(med - base) * 1e3:+8.1f} ms   "
              f"IQR [{q[0] * 1e3:.1f}, {q[2] * 1e3:.1f}] ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
