"""``TF_CPU_ALLOCATOR_USE_BFC`` is set where unset, and left as the user set it (no TensorFlow)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memprof_otel.sources import tf_cpu_statistics as t


def test_an_unset_variable_is_set_to_true_and_said_so(monkeypatch: pytest.MonkeyPatch) -> None:
    env: dict[str, str] = {}
    assert t.request_before_tensorflow(env) == "set"
    assert env == {t.ENV: "true"}


@pytest.mark.parametrize("value", ["false", "0", "true", ""])
def test_a_value_the_user_gave_is_left_alone(value: str) -> None:
    env = {t.ENV: value}
    assert t.request_before_tensorflow(env) == "user"
    assert env == {t.ENV: value}


def test_the_hint_names_the_variable_and_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(t.ENV, raising=False)
    assert "TF_CPU_ALLOCATOR_USE_BFC=true" in t.unavailable_hint()
    assert "before the process starts" in t.unavailable_hint()
    monkeypatch.setenv(t.ENV, "false")
    hint = t.unavailable_hint()
    assert hint.startswith("TF_CPU_ALLOCATOR_USE_BFC=false keeps TensorFlow's plain CPU allocator")


def test_how_requested_tells_who_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(t.ENV, raising=False)
    assert t.how_requested() == "TF_CPU_ALLOCATOR_USE_BFC unset"
    t.request_before_tensorflow()  # monkeypatch restores the environment afterwards
    assert t.how_requested() == "TF_CPU_ALLOCATOR_USE_BFC=true, set by memprof-otel at import"
    monkeypatch.setenv(t.ENV, "1")
    t.request_before_tensorflow()
    assert t.how_requested() == "TF_CPU_ALLOCATOR_USE_BFC=1, set by the environment"


@pytest.mark.parametrize("given", [None, "false"])
def test_importing_memprof_otel_sets_it_only_where_unset(given: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != t.ENV}
    if given is not None:
        env[t.ENV] = given
    out = subprocess.run([sys.executable, "-c", "import os, memprof_otel; print(os.environ.get('TF_CPU_ALLOCATOR_USE_BFC'))"],
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert out == (given or "true")
