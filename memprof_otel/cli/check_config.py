"""Validate a YAML config file: "ok: FILE" and a summary, or one line naming the bad key (exit 2).

By default the file is checked on its own; ``--env`` also applies the ``MEMPROF_OTEL_*``
variables of this shell, giving the config a process started here would run with.
"""
from __future__ import annotations

import argparse
import os

from ..config import Config, load_config, service_name_in_effect
from ..dumps.store import default_dir
from ..sources.tf_cpu_statistics import ENV as TF_BFC_ENV
from ..sources.tf_cpu_statistics import how_requested
from ..units import format_bytes



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="YAML config file")
    p.add_argument("--env", action="store_true",
                   help="also apply this shell's MEMPROF_OTEL_* environment variables")


def _threshold(metric: str, value: float) -> str:
    if metric.endswith("_bytes"):
        return format_bytes(value)
    return f"{value:g} s" if metric.endswith("_seconds") else f"{value:g}"


def _series(cfg: Config) -> str:
    c = cfg.series
    top = f"the root and the top {c.top_layers} layers per model"
    if c.full_detail_fraction:
        top += f" (every layer on {c.full_detail_fraction:.1%} of hosts)"
    chosen = {"all": "every layer", "top": top,
              "auto": f"{top} in a Kubernetes pod (KUBERNETES_SERVICE_HOST set), every layer elsewhere"}[c.layers]
    return f"{c.layers}: {chosen}; budget {c.budget:,} series"


def _tensorflow() -> str:
    """Whether Keras on TensorFlow gets CPU figures in a process started from this shell."""
    value = os.environ.get(TF_BFC_ENV, "")
    if value.strip().lower() in ("1", "true"):
        return (f"CPU statistics on ({how_requested()}); a process whose TensorFlow runs an op before "
                f"it imports memprof_otel needs {TF_BFC_ENV}=true in its environment")
    return f"CPU statistics only on CPUs with AVX-512/AMX ({how_requested()}): set {TF_BFC_ENV}=true for every CPU"


def summary_lines(cfg: Config) -> list[str]:
    otlp = cfg.otel.endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "none"
    rules = ", ".join(f"{r.name} ({r.metric} {r.op} {_threshold(r.metric, r.threshold)})"
                      for r in cfg.watchdog.rules)
    return [
        f"  service_name   {cfg.service_name or 'from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES, else memprof-otel'}",
        f"  sampler        every {cfg.sampler.interval:g} s, {cfg.sampler.buffer_size} samples kept",
        f"  attribution    {'on' if cfg.attribution.enabled else 'off'}, overhead budget "
        f"{cfg.attribution.overhead_budget:.2%}, window {cfg.attribution.window:g} s",
        f"  http           {cfg.http.host}:{cfg.http.port} "
        f"({'token set' if cfg.http.token else 'no token'})",
        f"  otel           {'on' if cfg.otel.enabled else 'off'}, OTLP endpoint {otlp}",
        f"  watchdog       {len(cfg.watchdog.rules)} rule(s){': ' + rules if rules else ''}",
        f"  series         {_series(cfg)}",
        f"  dumps          {cfg.dumps.dir or str(default_dir(service_name_in_effect(cfg.service_name, os.environ), '<pid>')) + ' (per process)'} "
        f"(max {cfg.dumps.max_files} files, "
        f"{format_bytes(cfg.dumps.max_bytes)})",
        f"  tensorflow     {_tensorflow()}",
    ]


def run(args: argparse.Namespace) -> int:
    # a ConfigError (unknown key, bad value, missing file, bad YAML) reaches main: one line, exit 2
    cfg = load_config(args.file, environ=None if args.env else {})
    print(f"ok: {args.file}")
    print("\n".join(summary_lines(cfg)))
    return 0
