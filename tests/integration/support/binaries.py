"""The external programs the real-component tests run (Prometheus, promtool, Go): found on PATH or
in /usr/bin, or the test fails saying how to install it. They never skip: CI installs them."""
from __future__ import annotations

import os
import shutil

import pytest


def required_binary(name: str, install_hint: str) -> str:
    found = shutil.which(name) or (f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None)
    if found is None:
        pytest.fail(f"the {name} binary is missing: {install_hint}")
    return found
