"""Show the system, torch and its devices, NVML and the host allocator memprof-otel would read.

Never fails on a missing part: an absent GPU, NVML or cgroup limit is reported as such.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from importlib import metadata
from typing import Any

import psutil

from .._version import __version__
from ..sources.cuda import _unavailable_reason, available_devices
from ..sources.glibc import HostAllocatorSource
from ..sources.nvml import NvmlSource, NvmlUnavailable
from ..sources.process import cgroup_memory_limit
from ..units import format_bytes



def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")


def _system() -> dict[str, Any]:
    try:
        with open("/proc/self/cgroup", encoding="ascii") as f:
            proc_cgroup = f.read()
    except OSError:
        proc_cgroup = ""
    try:  # where each cgroup hierarchy is mounted (without it, the usual /sys/fs/cgroup layout)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            mountinfo: str | None = f.read()
    except OSError:
        mountinfo = None
    limit = cgroup_memory_limit(proc_cgroup, mountinfo=mountinfo) if proc_cgroup else None
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {"python": platform.python_version(), "python_executable": sys.executable,
            "platform": platform.platform(), "cpu_count": os.cpu_count(), "cpus_usable": usable,
            "memory_total_bytes": psutil.virtual_memory().total, "cgroup_memory_limit_bytes": limit}


def _torch() -> dict[str, Any]:
    try:
        import torch  # why: report a missing or broken torch instead of failing
    except ImportError as e:
        return {"version": None, "error": str(e)}
    devices = []
    for i in available_devices():
        try:
            props = torch.cuda.get_device_properties(i)
            devices.append({"index": i, "name": props.name, "total_bytes": int(props.total_memory)})
        except Exception as e:  # noqa: BLE001 - a broken device is reported, not fatal
            devices.append({"index": i, "error": f"{type(e).__name__}: {e}"})
    return {"version": torch.__version__, "cuda_build": getattr(torch.version, "cuda", None),
            "cuda_available": bool(devices), "cuda_device_count": len(devices),
            "cuda_unavailable_reason": _unavailable_reason() if not devices else None,
            "cuda_devices": devices, "num_threads": torch.get_num_threads()}


def _nvml() -> dict[str, Any]:
    try:
        src = NvmlSource()
    except NvmlUnavailable as e:
        return {"up": False, "reason": e.detail}
    except Exception as e:  # noqa: BLE001 - same: a broken binding is a down source
        return {"up": False, "reason": f"{type(e).__name__}: {e}"}
    try:
        return {"up": True, "devices": src.device_info()}
    except Exception as e:  # noqa: BLE001
        return {"up": False, "reason": f"{type(e).__name__}: {e}"}
    finally:
        src.close()


def _allocator() -> dict[str, Any]:
    probe = HostAllocatorSource.probe()  # the same answer as sources.glibc.backend(), plus why not
    out: dict[str, Any] = {"backend": probe.backend, "figures": "mallinfo2" if probe.available else None}
    if not probe.available:
        out["reason"] = probe.reason
    return out


# framework -> (distributions that provide it, what memprof-otel does with it)
_FRAMEWORKS = {
    "torch": (("torch",), "instrument() per layer (CPU and CUDA)"),
    "keras": (("keras",), "Keras 3 models: per layer on the torch, TensorFlow and JAX backends (eager)"),
    "tensorflow": (("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tf-nightly"),
                   "Keras 3 models on the TensorFlow backend: per layer in eager mode"),
    "jax": (("jax",), "Keras 3 models on the JAX backend: per layer in eager mode (on CPU live-array "
                      "sizes: retained exact, peak a lower bound)"),
}


def _frameworks() -> dict[str, dict[str, Any]]:
    """Which model frameworks are installed, by their distributions' metadata: nothing is imported
    (importing TensorFlow alone takes seconds and fixes Keras's backend for the process)."""
    out = {}
    for name, (dists, use) in _FRAMEWORKS.items():
        version = None
        for dist in dists:
            try:
                version = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
        out[name] = {"version": version, "use": use}
    return out


def collect() -> dict[str, Any]:
    return {"memprof_otel": __version__, "system": _system(), "frameworks": _frameworks(), "torch": _torch(),
            "nvml": _nvml(), "host_allocator": _allocator()}


def _size(n: int | None) -> str:
    return "not set" if n is None else format_bytes(n)


def format_text(d: dict[str, Any]) -> str:
    s, t, n, a = d["system"], d["torch"], d["nvml"], d["host_allocator"]
    lines = [f"memprof-otel {d['memprof_otel']}",
             "system:",
             f"  python           {s['python']} ({s['python_executable']})",
             f"  platform         {s['platform']}",
             f"  cpus             {s['cpu_count']} ({s['cpus_usable']} usable by this process)",
             f"  memory total     {_size(s['memory_total_bytes'])}",
             f"  cgroup limit     {_size(s['cgroup_memory_limit_bytes'])}",
             "frameworks:"]
    for name, fw in d["frameworks"].items():
        state = f"{fw['version']}: {fw['use']}" if fw["version"] else "not installed"
        lines.append(f"  {name:<16} {state}")
    lines.append("torch:")
    if t.get("version") is None:
        lines.append(f"  not importable: {t.get('error')}")
    else:
        lines.append(f"  version          {t['version']} (CUDA build: {t['cuda_build'] or 'none'})")
        if t["cuda_available"]:
            lines.append(f"  cuda             {t['cuda_device_count']} device(s)")
            for dev in t["cuda_devices"]:
                desc = dev.get("error") or f"{dev['name']}, {_size(dev['total_bytes'])}"
                lines.append(f"    cuda:{dev['index']}         {desc}")
        else:
            lines.append(f"  cuda             not available: {t['cuda_unavailable_reason']}")
    lines.append("nvml:")
    if n["up"]:
        lines.append(f"  up               {len(n['devices'])} GPU(s)")
        for dev in n["devices"]:
            desc = dev.get("error") or (f"{dev['model']} ({dev['uuid']}), {_size(dev['total_bytes'])}, "
                                        f"driver {dev['driver_version']}")
            lines.append(f"    gpu {dev['index']}          {desc}")
            for mig in dev.get("mig_devices", ()):
                lines.append(f"      MIG {mig['uuid']} (GPU instance {mig['gpu_instance_id']}), "
                             f"{_size(mig['total_bytes'])}")
    else:
        lines.append(f"  down             {n['reason']}")
    figures = a["figures"] or f"none ({a.get('reason')})"
    lines += ["host allocator:", f"  backend          {a['backend']}", f"  figures          {figures}"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    d = collect()
    print(json.dumps(d, indent=2) if args.json else format_text(d))
    return 0
