"""pprof files of the flame graphs: a ``Flame`` as a gzipped ``perftools.profiles.Profile``.

``build_pprof(flame)`` is pure (no torch, no I/O; gzip in memory): one ``Function`` and one
``Location`` per distinct frame name (a module path, an op, or a Python ``file:line`` whose
function gets ``filename`` and whose location line gets ``line``), each sample's locations leaf
first as pprof wants (a ``Flame`` stack is root first), the flame's sample types with their units,
its labels as string labels on every sample and as ``key=value`` comments, its times. The values
are the flame's own, so each sample type's total is the flame's total, which for the first sample
type is the speedscope file's ``endValue``.

The messages are pprof's published ``profile.proto`` (vendored, unchanged, with its licence and
source in ``vendor/pprof/``).

Why not generated code: ``protoc``'s output is tied to the protobuf runtime that generated it (a
``_pb2.py`` made by a newer ``protoc`` refuses an older runtime, and the runtime here is whichever
the OTLP exporter pulled in). So the file's messages are declared below as a
``FileDescriptorProto`` and the classes built from it by that runtime, in a pool of our own (no
clash with another copy of ``profile.proto`` in the process), on first use. A unit test parses the
vendored ``.proto`` and checks this declaration against it field by field.
"""
from __future__ import annotations

import gzip
from functools import cache
from typing import Any

from .flame import Flame

PACKAGE = "perftools.profiles"

_I64, _U64, _BOOL, _STR, _MSG = "int64", "uint64", "bool", "string", "message"
# message -> [(field name, number, type, repeated)]; a message type names the message
MESSAGES: dict[str, list[tuple[str, int, str, bool]]] = {
    "Profile": [("sample_type", 1, "ValueType", True), ("sample", 2, "Sample", True),
                ("mapping", 3, "Mapping", True), ("location", 4, "Location", True),
                ("function", 5, "Function", True), ("string_table", 6, _STR, True),
                ("drop_frames", 7, _I64, False), ("keep_frames", 8, _I64, False),
                ("time_nanos", 9, _I64, False), ("duration_nanos", 10, _I64, False),
                ("period_type", 11, "ValueType", False), ("period", 12, _I64, False),
                ("comment", 13, _I64, True), ("default_sample_type", 14, _I64, False),
                ("doc_url", 15, _I64, False)],
    "ValueType": [("type", 1, _I64, False), ("unit", 2, _I64, False)],
    "Sample": [("location_id", 1, _U64, True), ("value", 2, _I64, True), ("label", 3, "Label", True)],
    "Label": [("key", 1, _I64, False), ("str", 2, _I64, False), ("num", 3, _I64, False),
              ("num_unit", 4, _I64, False)],
    "Mapping": [("id", 1, _U64, False), ("memory_start", 2, _U64, False), ("memory_limit", 3, _U64, False),
                ("file_offset", 4, _U64, False), ("filename", 5, _I64, False), ("build_id", 6, _I64, False),
                ("has_functions", 7, _BOOL, False), ("has_filenames", 8, _BOOL, False),
                ("has_line_numbers", 9, _BOOL, False), ("has_inline_frames", 10, _BOOL, False)],
    "Location": [("id", 1, _U64, False), ("mapping_id", 2, _U64, False), ("address", 3, _U64, False),
                 ("line", 4, "Line", True), ("is_folded", 5, _BOOL, False)],
    "Line": [("function_id", 1, _U64, False), ("line", 2, _I64, False), ("column", 3, _I64, False)],
    "Function": [("id", 1, _U64, False), ("name", 2, _I64, False), ("system_name", 3, _I64, False),
                 ("filename", 4, _I64, False), ("start_line", 5, _I64, False)],
}


def file_descriptor() -> Any:
    """``profile.proto`` as a ``FileDescriptorProto`` (proto3, package ``perftools.profiles``)."""
    from google.protobuf import descriptor_pb2  # why: protobuf loads only when a pprof file is written

    fd = descriptor_pb2.FileDescriptorProto(name="memprof_otel/pprof/profile.proto", package=PACKAGE,
                                            syntax="proto3")
    scalar = {_I64: descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
              _U64: descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
              _BOOL: descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
              _STR: descriptor_pb2.FieldDescriptorProto.TYPE_STRING}
    for name, fields in MESSAGES.items():
        msg = fd.message_type.add(name=name)
        for fname, number, ftype, repeated in fields:
            f = msg.field.add(name=fname, number=number, json_name=_json_name(fname),
                              label=(descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if repeated
                                     else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL))
            if ftype in scalar:
                f.type = scalar[ftype]
            else:
                f.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                f.type_name = f".{PACKAGE}.{ftype}"
    return fd


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


@cache
def message_classes() -> dict[str, Any]:
    """The message classes of ``profile.proto``, by message name (built once, in a private pool)."""
    from google.protobuf import descriptor_pool, message_factory  # why: as above, only for pprof files

    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_descriptor())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
            for name in MESSAGES}


class _Strings:
    def __init__(self) -> None:
        self.table: list[str] = [""]
        self.index: dict[str, int] = {"": 0}

    def id(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


def build_profile(flame: Flame) -> Any:
    """The ``Profile`` message of ``flame`` (see the module docstring)."""
    classes = message_classes()
    profile = classes["Profile"]()
    strings = _Strings()
    for t, u in flame.sample_types:
        profile.sample_type.add(type=strings.id(t), unit=strings.id(u))
    # one read-only "mapping" saying the locations are symbolized: pprof then never looks for a binary
    profile.mapping.add(id=1, filename=strings.id("memprof-otel"), has_functions=True,
                        has_filenames=bool(flame.frame_lines), has_line_numbers=bool(flame.frame_lines))
    locations: dict[str, int] = {}

    def location(frame: str) -> int:
        loc = locations.get(frame)
        if loc is None:
            loc = locations[frame] = len(locations) + 1
            file, line = flame.frame_lines.get(frame, ("", 0))
            profile.function.add(id=loc, name=strings.id(frame), system_name=strings.id(frame),
                                 filename=strings.id(file))
            profile.location.add(id=loc, mapping_id=1).line.add(function_id=loc, line=line)
        return loc

    labels = [(strings.id(k), strings.id(v)) for k, v in flame.labels]
    for stack, values in zip(flame.stacks, flame.values):
        sample = profile.sample.add(location_id=[location(f) for f in reversed(stack)], value=values)
        for k, v in labels:
            sample.label.add(key=k, str=v)
    profile.time_nanos = flame.time_nanos
    profile.duration_nanos = flame.duration_nanos
    profile.period_type.type = strings.id(flame.period_type[0])
    profile.period_type.unit = strings.id(flame.period_type[1])
    profile.period = 1   # every allocation is recorded: nothing is sampled
    profile.default_sample_type = strings.id(flame.sample_types[0][0])
    profile.comment.extend(strings.id(c) for c in (*flame.comments, *(f"{k}={v}" for k, v in flame.labels)))
    profile.string_table.extend(strings.table)
    return profile


def build_pprof(flame: Flame) -> bytes:
    """``flame`` as a pprof file: the serialized ``Profile``, gzipped (as pprof stores them)."""
    return gzip.compress(build_profile(flame).SerializeToString(), mtime=0)


def parse_pprof(data: bytes) -> Any:
    """A pprof file (gzipped or not) back as a ``Profile`` message."""
    raw = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    profile = message_classes()["Profile"]()
    profile.ParseFromString(raw)
    return profile


def is_pprof_path(path: Any) -> bool:
    """True for a path that names a pprof file: ending ``.pb.gz`` or ``.pprof``."""
    return str(path).lower().endswith((".pb.gz", ".pprof"))
