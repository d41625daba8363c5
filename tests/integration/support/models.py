"""Small real CPU models: hand-built ones whose allocations the tests control to the byte, and tiny
transformers models built from configs (no download)."""
from __future__ import annotations

import pytest
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


ATTENTION_TRANSIENT_FLOATS = 12_000_000  # 48 MB: over the layer rule's 32 MiB floor, small for a CI machine


class Attention(nn.Module):
    """Materializes a large temporary (as an attention matrix would), frees it, returns x + 1."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.ones(ATTENTION_TRANSIENT_FLOATS)
        del scores
        return x + 1


class AttentionNet(nn.Module):
    """proj (a Linear), then self_attn: nearly the whole forward's transient is the attention's."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.self_attn = Attention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.self_attn(self.proj(x))


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


# ---- transformers models from tiny configs (no download) ----------------------------------------
TINY_VOCAB = 1000


def tiny_gpt2() -> nn.Module:
    """GPT-2 with 2 blocks of width 64, in eval mode (the weights are the seeded default init)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=TINY_VOCAB, n_positions=512, n_embd=64, n_layer=2, n_head=2,
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def tiny_bert() -> nn.Module:
    """A BERT encoder with 2 layers of width 64, in eval mode."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=TINY_VOCAB, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=128, max_position_embeddings=128)
    return transformers.BertModel(cfg).eval()
