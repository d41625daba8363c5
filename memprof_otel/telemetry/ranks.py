"""Which rank of a distributed job this process is, from what ``torchrun`` sets (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``; DeepSpeed's, Accelerate's and Lightning's launchers set the same).

Every rank runs the same script, so without something that tells them apart their series collide:
same names, same labels (the same model, layers and devices), and on one host the same port.
Three things follow from the rank, and only where the process is a rank (``RANK`` set, to a
number): a plain process gets none of them, its label sets stay exactly as they were.

- A ``rank`` label on every series the process exports, in the Prometheus exposition and on the
  OTel data points alike. Prometheus usually adds target labels itself, from service discovery,
  but a scrape config seldom knows which rank listens on which port (a static list of ports, a
  pod with several ranks): a label the process carries makes ``sum by (rank)`` and
  ``max by (rank)`` work without joins and without relabelling, the same whether the series were
  scraped or pushed over OTLP (where resource attributes do not become labels unless the
  receiver promotes them). One label only: ``local_rank`` and ``world_size`` follow from the rank
  and the host, and every extra constant label is one more on each of the process's series.
- The OTel resource: ``torch.distributed.rank``, ``torch.distributed.local_rank`` and
  ``torch.distributed.world_size``. OpenTelemetry's semantic conventions define no attribute for a
  training rank; these are namespaced after the API that defines the values.
  ``service.instance.id`` is already unique per process.
- The port: rank ``LOCAL_RANK`` serves on ``http.port + LOCAL_RANK`` (``http.port_per_rank``), as
  each worker of a pre-fork server gets a port of its own (``http/workers.py``).

A ``RANK`` that is not a number (ASCII digits, below ``MAX_RANK``), or a ``WORLD_SIZE`` > 1
without a ``RANK``, tells no rank: the process is treated as a plain one, and a warning says so
once, since its series will collide with the other ranks'. Without ``LOCAL_RANK`` the local rank
is 0 (a warning too when it is set but not a number).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .._log import warn_once

RANK_LABEL = "rank"
RESOURCE_PREFIX = "torch.distributed."
# no job has a million ranks; a larger figure is a mistake (and overflows an OTel int attribute)
MAX_RANK = 1_000_000


@dataclass(frozen=True)
class Ranks:
    """This process's place in a distributed job (``rank`` 0 of 1 for a plain process)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    distributed: bool = False  # RANK set

    def labels(self) -> dict[str, str]:
        """The constant labels every series of the process carries: ``{"rank": "3"}``, or none."""
        return {RANK_LABEL: str(self.rank)} if self.distributed else {}

    def resource_attributes(self) -> dict[str, object]:
        """The OTel resource attributes of a rank (none for a plain process)."""
        if not self.distributed:
            return {}
        return {f"{RESOURCE_PREFIX}rank": self.rank, f"{RESOURCE_PREFIX}local_rank": self.local_rank,
                f"{RESOURCE_PREFIX}world_size": self.world_size}

    def port_offset(self) -> int:
        """How far past ``http.port`` this rank serves: its ``LOCAL_RANK`` (0 for a plain process)."""
        return self.local_rank if self.distributed else 0


def _int(environ: Mapping[str, str], name: str) -> int | None:
    """The variable as a number, None when unset or not one. Only ASCII digits: ``str.isdigit``
    also takes "²" (which ``int`` refuses) and "٣" (which it reads as 3)."""
    raw = (environ.get(name) or "").strip()
    if raw.isascii() and raw.isdigit() and int(raw) < MAX_RANK:
        return int(raw)
    if raw:
        warn_once(f"rank-variable-{name}-{raw[:40]}",
                  "memprof_otel: %s=%r is not a number below %d; %s", name, raw[:40], MAX_RANK,
                  "the process is not labelled as a rank: its series collide with the other ranks'"
                  if name == "RANK" else f"{name} is taken as unset")
    return None


def ranks_from(environ: Mapping[str, str] | None = None) -> Ranks:
    """The ``Ranks`` the launcher's variables describe (``os.environ`` by default)."""
    env = os.environ if environ is None else environ
    rank, local, world = _int(env, "RANK"), _int(env, "LOCAL_RANK"), _int(env, "WORLD_SIZE")
    if rank is None:
        if (world or 0) > 1 and not (env.get("RANK") or "").strip():
            warn_once("rank-variable-missing", "memprof_otel: WORLD_SIZE=%d but RANK is not set: the process is "
                      "not labelled as a rank, so the ranks' series and ports collide (set RANK, as torchrun "
                      "does)", world)
        return Ranks()
    return Ranks(rank=rank, local_rank=local or 0, world_size=max(world or 1, rank + 1), distributed=True)


def process_labels(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The constant labels of this process's series (``{}`` unless it is a rank)."""
    return ranks_from(environ).labels()
