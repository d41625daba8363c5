"""Schemas the tests validate the project's output against, vendored under tests/vendor/.

Every test that checks a speedscope file goes through here, so the schema's location is written
once: tests/vendor/speedscope/file-format-schema.json (speedscope's published file-format schema;
source, version and licence in tests/vendor/speedscope/README.md and LICENSE).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema

VENDOR = Path(__file__).resolve().parent / "vendor"
SPEEDSCOPE_SCHEMA = VENDOR / "speedscope" / "file-format-schema.json"


@functools.cache
def speedscope_schema() -> dict[str, Any]:
    """The speedscope file-format JSON Schema (draft-07)."""
    return json.loads(SPEEDSCOPE_SCHEMA.read_text(encoding="utf-8"))


def speedscope_validator() -> "jsonschema.Draft7Validator":
    """A validator for speedscope documents: ``.validate(doc)`` raises on an invalid file."""
    import jsonschema

    return jsonschema.Draft7Validator(speedscope_schema())


def validate_speedscope(doc: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``doc`` is a valid speedscope file."""
    speedscope_validator().validate(doc)
