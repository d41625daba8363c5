"""Fixtures for the shipped-asset tests: the real promtool, never a stand-in."""
from __future__ import annotations

import shutil

import pytest

from .promtool import MISSING


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path of promtool. Missing promtool fails the tests (it does not skip them)."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(MISSING, pytrace=False)
    return path
