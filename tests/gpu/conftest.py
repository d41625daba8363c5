"""Everything under tests/gpu needs a real CUDA device; without one it is skipped, with a reason."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).parent.resolve()
_HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items, so only touch the ones collected from here.
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.gpu)
            if not _HAS_CUDA:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
