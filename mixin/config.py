"""The mixin's configuration: config.yaml's defaults with a user's file merged over them.

Validation is strict (unknown keys, wrong types and malformed durations are errors naming the key)
because a typo in a monitoring config otherwise shows up only as an alert that never fires.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

DEFAULTS = Path(__file__).resolve().parent / "config.yaml"

# Maps whose keys are the user's own (label names), not config keys.
_FREE_MAPS = {("alerts", "extra_labels"), ("kubernetes", "labels")}
# Keys that moved, with where they are now: named in the error instead of "unknown key".
_MOVED = {("dashboards", "cluster_label"): "cluster_label", ("dashboards", "namespace_label"): "namespace_label"}
_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
_DURATION_KEYS = {"for", "window", "interval", "horizon"}
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class MixinConfigError(ValueError):
    """A configuration file that cannot be used; the message names the key."""


def defaults() -> dict[str, Any]:
    return yaml.safe_load(DEFAULTS.read_text(encoding="utf-8"))


def load(path: Path | None = None) -> dict[str, Any]:
    """The defaults, with ``path`` (a YAML mapping) merged over them and validated."""
    base = defaults()
    if path is None:
        return base
    try:
        user = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise MixinConfigError(f"{path}: cannot read it ({e.strerror})") from e
    except yaml.YAMLError as e:
        raise MixinConfigError(f"{path}: not valid YAML ({e})") from e
    if user is None:
        return base
    if not isinstance(user, dict):
        raise MixinConfigError(f"{path}: the top level must be a mapping, got {type(user).__name__}")
    return merge(base, user)


def merge(base: dict[str, Any], user: dict[str, Any], where: tuple[str, ...] = ()) -> dict[str, Any]:
    """``user`` over ``base``, key by key; every key and type must exist in ``base``."""
    out = copy.deepcopy(base)
    for key, value in user.items():
        path = (*where, str(key))
        name = ".".join(path)
        if where in _FREE_MAPS:
            if not _LABEL_NAME.match(str(key)) or not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise MixinConfigError(f"{name}: labels need a label name and a string value")
            out[key] = str(value)
            continue
        if key not in base and path in _MOVED:
            raise MixinConfigError(f"{name}: moved to the top level as {_MOVED[path]} (the recording rules "
                                   "keep that label too, not only the dashboards)")
        if key not in base:
            known = ", ".join(sorted(base))
            raise MixinConfigError(f"{name}: unknown key (known here: {known})")
        default = base[key]
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise MixinConfigError(f"{name}: expected a mapping, got {value!r}")
            out[key] = merge(default, value, path)
        else:
            out[key] = _checked(name, key, default, value)
    return out


def _checked(name: str, key: str, default: Any, value: Any) -> Any:
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    elif isinstance(default, list):
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    else:
        ok = isinstance(value, str)
    if not ok:
        raise MixinConfigError(f"{name}: expected {type(default).__name__} like {default!r}, got {value!r}")
    if key in _DURATION_KEYS and not _DURATION.match(value) and not (key == "interval" and value == ""):
        raise MixinConfigError(f"{name}: expected a Prometheus duration such as 5m or 1h30m, got {value!r}")
    if key == "quantile" and not 0 <= value <= 1:
        raise MixinConfigError(f"{name}: a quantile is between 0 and 1, got {value!r}")
    if key.endswith("_label") and not _LABEL_NAME.match(value):
        raise MixinConfigError(f"{name}: a Prometheus label name such as cluster, got {value!r}")
    if key == "selector" and ("{" in value or "}" in value):
        raise MixinConfigError(f"{name}: label matchers only, without braces, e.g. 'namespace=\"ml\"'")
    return value
