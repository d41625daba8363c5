"""docs/reference.md, the user reference, against the code: every configuration key with its
default, and every CLI command. (Metrics: tests/unit/test_metric_names.py; routes:
tests/integration/test_http_endpoint.py.)"""
from __future__ import annotations

import tempfile

import pytest
import yaml

import memprof_otel as mp
from memprof_otel.cli import COMMANDS
from tests import reference_doc


def _code_keys() -> set[str]:
    keys = set()
    for name, value in mp.Config().to_dict().items():
        if isinstance(value, dict):
            keys.update(f"{name}.{k}" for k in value)
        else:
            keys.add(name)
    return keys


def test_configuration_table_lists_exactly_the_config_keys():
    documented = set(reference_doc.documented_config())
    assert len(documented) >= 25  # a guard on the parser
    assert documented == _code_keys(), (
        f"only in docs/reference.md: {sorted(documented - _code_keys())}; "
        f"only in the code: {sorted(_code_keys() - documented)}")


@pytest.mark.parametrize("key", sorted(reference_doc.documented_config()))
def test_documented_default_is_the_default(key: str):
    written = reference_doc.first_code(reference_doc.documented_config()[key])
    written = written.replace("<temp dir>", tempfile.gettempdir())  # platform-dependent, described
    if "<" in written:
        pytest.skip(f"{key}: default described as {written!r}")
    section, _, field = key.partition(".")
    value = yaml.safe_load(written)
    layer = {section: {field: value}} if field else {section: value}
    documented = mp.load_config(layer, environ={})
    default = mp.load_config(None, environ={})
    pick = (lambda c: getattr(getattr(c, section), field)) if field else (lambda c: getattr(c, section))
    assert pick(documented) == pick(default), (key, written, pick(default))


def test_cli_table_lists_exactly_the_commands():
    assert reference_doc.documented_commands() == set(COMMANDS)
