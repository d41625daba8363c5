"""Small real CPU models whose allocations the tests control to the byte."""
from __future__ import annotations

import torch
from torch import nn

F32 = 4


class Transient(nn.Module):
    """Allocates ``n`` floats, frees them, returns x + 1 (one fresh tensor the size of x)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.ones(self.n)
        del t
        return x + 1


class Keep(nn.Module):
    """Allocates ``n`` floats and returns them alongside x + 1."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, torch.zeros(self.n)


class Tree(nn.Module):
    """root: pre-transient, a (Transient 1000), b (Transient 5000 with child c Transient 20000)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = Transient(1000)
        self.b = nn.Sequential(Transient(5000), Transient(20000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.empty(3000)  # the root's own transient, before any child runs
        del t
        return self.b(self.a(x))


class Raiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty(7000).zero_()  # zeroed in place: garbage may hold NaN, and NaN * 0 is NaN
        if self.fail:
            raise ValueError("boom from inside the model")
        return x + y[: x.numel()].view_as(x) * 0


class WithRaiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = Transient(100)
        self.r = Raiser()
        self.post = Transient(200)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.r(self.pre(x)))


class KwargsDict(nn.Module):
    """Forward with kwargs, returning a dict and calling one child twice."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = Transient(4000)
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> dict[str, torch.Tensor]:
        h = self.shared(x)
        h = self.shared(h)
        return {"out": self.lin(h) * scale, "aux": h}
