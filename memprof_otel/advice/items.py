"""One advice item and the figures it cites."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

# lowest first: ``severity_rank`` orders them, ``min_severity`` filters by it
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")

# units a cited figure can have; the CLI turns "bytes" and "bytes_per_second" into KiB/MiB/GiB
UNITS: tuple[str, ...] = ("bytes", "bytes_per_second", "ratio", "count", "seconds", "batch")


def severity_rank(severity: str) -> int:
    """0 for info, 1 for warning, 2 for critical; ValueError for anything else."""
    try:
        return SEVERITIES.index(severity)
    except ValueError:
        raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}, got {severity!r}") from None


@dataclass(frozen=True)
class Figure:
    """One measured number as the advice cites it."""
    value: float
    unit: str

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {self.unit!r}")

    def to_dict(self) -> dict[str, Any]:
        v = self.value
        return {"value": int(v) if self.unit in ("bytes", "count", "batch") else v, "unit": self.unit}


@dataclass(frozen=True)
class Advice:
    """``id`` is stable (the docs anchor, what scripts match on); ``source`` says where the figures
    come from; ``context`` names what they are about (device, model, layer). No advice exists
    without at least one figure: a rule that cannot cite a measurement stays silent."""
    id: str
    severity: str
    title: str
    source: str
    figures: Mapping[str, Figure]
    action: str
    context: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        severity_rank(self.severity)
        if not self.figures:
            raise ValueError(f"advice {self.id} cites no measurement")

    @property
    def docs(self) -> str:
        """Relative link into the repository's docs: one section per id."""
        return f"docs/advice.md#{self.id}"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "severity": self.severity, "title": self.title,
                "evidence": {"source": self.source, **self.context,
                             "figures": {k: f.to_dict() for k, f in self.figures.items()}},
                "action": self.action, "docs": self.docs}
