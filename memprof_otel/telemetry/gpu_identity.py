"""Which GPU is torch's ``cuda:N``? torch's device UUIDs matched to NVML's (pure, no torch).

Three numberings meet on a GPU node and agree only by chance: torch counts the devices left by
``CUDA_VISIBLE_DEVICES`` (in ``CUDA_DEVICE_ORDER``), the NVML inside a container counts, in PCI
bus order, only the GPUs the container was given, and dcgm-exporter (a DaemonSet that sees every
GPU of the node) counts all of them. A pod given the node's GPUs 5 and 2 may call them ``cuda:0``
and ``cuda:1``, while its NVML calls them ``gpu="1"`` and ``gpu="0"`` (bus order) and dcgm-exporter
``gpu="5"`` and ``gpu="2"``. The UUID is the same everywhere: the mapping series carries it.

torch reports a UUID as bare hex (``58c5aa1c-...``), NVML with a ``GPU-`` or ``MIG-`` prefix. A
CUDA device that is a MIG device matches one of its parent's MIG UUIDs; then ``gpu_uuid`` is the
parent's (what our ``memprof_gpu_*`` series and dcgm-exporter's ``UUID`` carry) and ``mig_uuid``,
``gpu_instance_id`` name the instance.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..timeline import GpuReading

__all__ = ["CudaDeviceIdentity", "identify", "normalize_uuid"]

_PREFIXES = ("gpu-", "mig-")


@dataclass(frozen=True)
class CudaDeviceIdentity:
    device: str            # "cuda:0": the `device` label of allocator and layer series
    gpu: str               # NVML index of the (parent) GPU in this process's view; "" when unmatched
    gpu_uuid: str          # "GPU-...": the (parent) GPU
    mig_uuid: str = ""     # "MIG-..." when the CUDA device is a MIG device
    gpu_instance_id: str = ""  # the MIG GPU instance (dcgm-exporter's GPU_I_ID)

    @property
    def matched(self) -> bool:
        return self.gpu != ""


def normalize_uuid(uuid: str) -> str:
    """Lower-case hex without NVML's ``GPU-``/``MIG-`` prefix: the form torch and NVML share."""
    u = uuid.strip().lower()
    for p in _PREFIXES:
        if u.startswith(p):
            return u[len(p):]
    return u


def identify(cuda_uuids: Mapping[int, str], gpus: Sequence[GpuReading]) -> list[CudaDeviceIdentity]:
    """One identity per CUDA device, in index order. A device NVML does not show (NVML down, or a
    UUID form we do not know) keeps torch's UUID as ``GPU-<hex>`` and ``gpu=""``."""
    by_hex: dict[str, tuple[GpuReading, str, str]] = {}
    for g in gpus:
        by_hex[normalize_uuid(g.uuid)] = (g, "", "")
        for m in g.migs:
            by_hex[normalize_uuid(m.uuid)] = (g, m.uuid, str(m.gpu_instance_id))
    out = []
    for index, uuid in sorted(cuda_uuids.items()):
        hex_ = normalize_uuid(uuid)
        hit = by_hex.get(hex_)
        if hit is None:
            out.append(CudaDeviceIdentity(f"cuda:{index}", "", f"GPU-{hex_}"))
            continue
        g, mig_uuid, gi = hit
        out.append(CudaDeviceIdentity(f"cuda:{index}", str(g.index), g.uuid, mig_uuid, gi))
    return out
