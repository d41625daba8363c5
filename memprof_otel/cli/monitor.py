"""Live terminal view of a running endpoint: memory, allocators, GPUs, top layers, alerts, sampler.

Reads ``/v1/status``, ``/metrics`` and ``/v1/alerts`` every ``--interval`` seconds and redraws the
screen (ANSI clear when stdout is a terminal; frames one after another otherwise). ``--once``
prints one frame and exits. Ctrl-C exits cleanly (0).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ..units import format_bytes, format_metric_value
from ._common import Client, CommandError, add_endpoint_arguments

CLEAR = "\x1b[H\x1b[2J"
TOP_LAYERS = 10


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_endpoint_arguments(p)
    p.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one frame and exit")


Series = dict[str, list[tuple[dict[str, str], float]]]


def parse_metrics(text: str) -> Series:
    """Prometheus text -> sample name -> [(labels, value)] (histogram/summary parts by sample name)."""
    out: Series = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except ValueError as e:
        raise CommandError(f"/metrics is not Prometheus text: {e}") from None
    return out


def fetch(client: Client) -> dict[str, Any]:
    status = client.json("GET", "/v1/status")
    metrics = parse_metrics(client.request("GET", "/metrics", accept="text/plain").decode("utf-8", "replace"))
    alerts = client.json("GET", "/v1/alerts")
    return {"status": status if isinstance(status, dict) else {}, "metrics": metrics,
            "alerts": alerts.get("alerts", []) if isinstance(alerts, dict) else []}


def _one(m: Series, name: str, **labels: str) -> float | None:
    for lab, v in m.get(name, []):
        if all(lab.get(k) == val for k, val in labels.items()):
            return v
    return None


def _b(v: float | None) -> str:
    return "n/a" if v is None else format_bytes(v)


def _memory_lines(m: Series) -> list[str]:
    rss = _one(m, "memprof_process_resident_memory_bytes")
    limit = _one(m, "memprof_process_memory_limit_bytes")
    share = f" ({rss / limit:.1%} of it)" if rss is not None and limit else ""
    cpu = _one(m, "memprof_process_cpu_utilization_ratio")
    lines = [f"RSS {_b(rss)}   limit {_b(limit) if limit else 'none (no cgroup limit)'}{share}   "
             f"peak RSS {_b(_one(m, 'memprof_process_peak_resident_memory_bytes'))}   "
             f"CPU {'n/a' if cpu is None else f'{cpu:.0%}'}"]
    for lab, alloc in sorted(m.get("memprof_allocator_allocated_bytes", []), key=lambda x: x[0].get("device", "")):
        dev = lab.get("device", "?")
        reserved = _one(m, "memprof_allocator_reserved_bytes", device=dev)
        frag = _one(m, "memprof_allocator_fragmentation_ratio", device=dev)
        lines.append(f"allocator {dev:<8} allocated {_b(alloc):>10}   reserved {_b(reserved):>10}   "
                     f"fragmentation {'n/a' if frag is None else f'{frag:.1%}'}")
    for lab, used in m.get("memprof_gpu_memory_used_bytes", []):
        gpu = lab.get("gpu", "?")
        total = _one(m, "memprof_gpu_memory_total_bytes", gpu=gpu)
        mine = _one(m, "memprof_gpu_process_memory_used_bytes", gpu=gpu)
        torch_reserved = _one(m, "memprof_gpu_process_torch_reserved_bytes", gpu=gpu)
        if mine is None and torch_reserved is not None:  # NVML cannot see us (a container)
            me = f"n/a (torch reserves {_b(torch_reserved)}: no CUDA context, no other libraries)"
        else:
            me = _b(mine)
        lines.append(f"gpu {gpu:<3} used {_b(used)} of {_b(total)}   this process {me}")
        for mlab, mused in m.get("memprof_gpu_mig_memory_used_bytes", []):
            if mlab.get("gpu") == gpu:
                mtotal = _one(m, "memprof_gpu_mig_memory_total_bytes", mig_uuid=mlab.get("mig_uuid", ""))
                lines.append(f"  MIG {mlab.get('gpu_instance_id', '?'):<3} used {_b(mused)} of {_b(mtotal)}   "
                             f"{mlab.get('mig_uuid', '')}")
    return lines


def _layer_lines(m: Series, status: dict[str, Any]) -> list[str]:
    rows = [(lab, v) for lab, v in m.get("memprof_layer_peak_increase_bytes", []) if lab.get("layer")]
    rows.sort(key=lambda r: r[1], reverse=True)
    models = ", ".join(f"{x.get('name')} on {x.get('device')} ({x.get('forwards', 0)} forwards, "
                       f"{x.get('attributed_forwards', 0)} attributed)" for x in status.get("models", []))
    lines = [f"models: {models or 'none instrumented'}"]
    if not rows:
        return lines + ["no layer figures yet (no attributed forward)"]
    width = max(20, *(len(lab.get("layer", "")) for lab, _ in rows[:TOP_LAYERS]))
    lines.append(f"top {min(TOP_LAYERS, len(rows))} layers by peak increase:")
    lines.append(f"  {'model':<12} {'layer':<{width}} {'peak +':>10} {'retained':>10}")
    for lab, v in rows[:TOP_LAYERS]:
        ret = _one(m, "memprof_layer_retained_bytes", model=lab.get("model", ""), layer=lab.get("layer", ""))
        lines.append(f"  {lab.get('model', ''):<12} {lab.get('layer', ''):<{width}} {_b(v):>10} {_b(ret):>10}")
    return lines


def _shown(alert: dict[str, Any], key: str) -> str:
    """An alert's value or threshold in the unit of its metric, like every other figure here."""
    v = alert.get(key)
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return str(v)
    return format_metric_value(str(alert.get("metric", "")), v)


def _alert_lines(alerts: list[dict[str, Any]]) -> list[str]:
    active = [a for a in alerts if a.get("state") in ("pending", "firing")]
    if not active:
        return ["alerts: none active"]
    lines = [f"alerts: {len(active)} active"]
    for a in active:
        labels = ",".join(f"{k}={v}" for k, v in (a.get("labels") or {}).items())
        lines.append(f"  [{a.get('state', '?').upper()}] {a.get('rule')} ({a.get('severity')}): "
                     f"{a.get('metric')}{'{' + labels + '}' if labels else ''} = {_shown(a, 'value')} "
                     f"{a.get('op')} {_shown(a, 'threshold')}")
    return lines


def _sampler_lines(m: Series, status: dict[str, Any]) -> list[str]:
    s = status.get("sampler") or {}
    last = s.get("last_success_unix") or 0
    age = f"{time.time() - last:.1f} s ago" if last else "never"
    dur = s.get("last_duration_seconds")
    sources = []
    for name, src in sorted((status.get("sources") or {}).items()):
        src = src if isinstance(src, dict) else {}
        why = "" if src.get("up") else f" ({src.get('last_error') or 'no reading yet'})"
        errs = f" [{src['errors']} errors]" if src.get("errors") else ""
        sources.append(f"{name} {'up' if src.get('up') else 'DOWN'}{why}{errs}")
    return [f"sampler: {'running' if s.get('running') else 'NOT RUNNING'}, every "
            f"{s.get('interval_seconds', '?')} s, last tick {float(dur or 0) * 1e3:.1f} ms, "
            f"last success {age}",
            f"sources: {'; '.join(sources) or 'none'}"]


def render(url: str, data: dict[str, Any]) -> str:
    status, m = data["status"], data["metrics"]
    head = (f"memprof-otel monitor  {url}  {time.strftime('%H:%M:%S')}  "
            f"(endpoint {status.get('version', '?')}, torch {status.get('torch_version') or '?'})")
    parts = [[head, "=" * len(head)], _memory_lines(m), _layer_lines(m, status), _alert_lines(data["alerts"]),
             _sampler_lines(m, status)]
    return "\n\n".join("\n".join(p) for p in parts)


def run(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise CommandError(f"--interval must be positive, got {args.interval:g}", 2)
    client = Client(args.url, args.token, timeout=max(5.0, args.interval))
    frame = render(client.base, fetch(client))  # an unreachable endpoint fails here: exit 1
    if args.once:
        print(frame)
        return 0
    tty = sys.stdout.isatty()
    try:
        while True:
            sys.stdout.write((CLEAR if tty else "\n") + frame + "\n")
            sys.stdout.flush()
            time.sleep(args.interval)
            try:
                frame = render(client.base, fetch(client))
            except CommandError as e:  # the endpoint went away: say so, keep trying
                frame = f"memprof-otel monitor  {client.base}  {time.strftime('%H:%M:%S')}\n\n{e}"
    except KeyboardInterrupt:
        if tty:
            sys.stdout.write("\n")
        return 0
