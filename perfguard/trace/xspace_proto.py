"""The XSpace protobuf classes, declared here so reading needs no TensorFlow.

TensorFlow, JAX and XProf write profiles as ``XSpace`` messages
(``<host>.xplane.pb``). The schema is public: tensorflow/tsl
``tsl/profiler/protobuf/xplane.proto`` (package ``tensorflow.profiler``;
now also ``xla/tsl/profiler/protobuf/xplane.proto``). Only the field numbers
and types below matter on the wire; they are declared once, as data, and
turned into message classes by the ``protobuf`` package, whose C (upb)
parser decodes a file far faster than Python could walk its varints.
"""

from __future__ import annotations

from functools import cache
from typing import Any

# (message, [(field, number, type, label, message type or None)]); a map<int64, M>
# is on the wire a repeated entry message {int64 key = 1; M value = 2}.
_I64, _U64, _DBL, _STR, _BYT, _MSG = "int64", "uint64", "double", "string", "bytes", "message"
_REP, _OPT = "repeated", "optional"
_MESSAGES: list[tuple[str, list[tuple[str, int, str, str, str | None]]]] = [
    (
        "XStat",
        [
            ("metadata_id", 1, _I64, _OPT, None),
            ("double_value", 2, _DBL, _OPT, None),
            ("uint64_value", 3, _U64, _OPT, None),
            ("int64_value", 4, _I64, _OPT, None),
            ("str_value", 5, _STR, _OPT, None),
            ("bytes_value", 6, _BYT, _OPT, None),
            ("ref_value", 7, _U64, _OPT, None),
        ],
    ),
    (
        "XEvent",
        [
            ("metadata_id", 1, _I64, _OPT, None),
            ("offset_ps", 2, _I64, _OPT, None),
            ("num_occurrences", 5, _I64, _OPT, None),
            ("duration_ps", 3, _I64, _OPT, None),
            ("stats", 4, _MSG, _REP, "XStat"),
        ],
    ),
    (
        "XLine",
        [
            ("id", 1, _I64, _OPT, None),
            ("display_id", 10, _I64, _OPT, None),
            ("name", 2, _STR, _OPT, None),
            ("display_name", 11, _STR, _OPT, None),
            ("timestamp_ns", 3, _I64, _OPT, None),
            ("duration_ps", 9, _I64, _OPT, None),
            ("events", 4, _MSG, _REP, "XEvent"),
        ],
    ),
    (
        "XEventMetadata",
        [
            ("id", 1, _I64, _OPT, None),
            ("name", 2, _STR, _OPT, None),
            ("display_name", 4, _STR, _OPT, None),
            ("metadata", 3, _BYT, _OPT, None),
            ("stats", 5, _MSG, _REP, "XStat"),
            ("child_id", 6, _I64, _REP, None),
        ],
    ),
    (
        "XStatMetadata",
        [
            ("id", 1, _I64, _OPT, None),
            ("name", 2, _STR, _OPT, None),
            ("description", 3, _STR, _OPT, None),
        ],
    ),
    (
        "EventMetadataEntry",
        [
            ("key", 1, _I64, _OPT, None),
            ("value", 2, _MSG, _OPT, "XEventMetadata"),
        ],
    ),
    (
        "StatMetadataEntry",
        [
            ("key", 1, _I64, _OPT, None),
            ("value", 2, _MSG, _OPT, "XStatMetadata"),
        ],
    ),
    (
        "XPlane",
        [
            ("id", 1, _I64, _OPT, None),
            ("name", 2, _STR, _OPT, None),
            ("lines", 3, _MSG, _REP, "XLine"),
            ("event_metadata", 4, _MSG, _REP, "EventMetadataEntry"),
            ("stat_metadata", 5, _MSG, _REP, "StatMetadataEntry"),
            ("stats", 6, _MSG, _REP, "XStat"),
        ],
    ),
    (
        "XSpace",
        [
            ("planes", 1, _MSG, _REP, "XPlane"),
            ("errors", 2, _STR, _REP, None),
            ("warnings", 3, _STR, _REP, None),
            ("hostnames", 4, _STR, _REP, None),
        ],
    ),
]
#: oneof groups (message -> (oneof name, its fields)): their presence is on the wire
_ONEOFS = {
    "XStat": (
        "value",
        ("double_value", "uint64_value", "int64_value", "str_value", "bytes_value", "ref_value"),
    ),
    "XEvent": ("data", ("offset_ps", "num_occurrences")),
}
#: a package of our own: the classes never clash with TensorFlow's in one process
_PACKAGE = "perfguard.xspace"


@cache
def xspace_class(raw_events: bool = False) -> Any:
    """The ``XSpace`` message class (built once per process).

    ``raw_events=True``: ``XLine.events`` is declared ``repeated bytes``, so
    parsing leaves each event serialized, for :mod:`perfguard.trace.xevents`
    to decode all at once (same wire format: a message field and a bytes
    field are both length-delimited).
    """
    # protobuf: loaded only when an XSpace is read, not by every trace reader
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    package = _PACKAGE + (".raw" if raw_events else "")
    fdp = descriptor_pb2.FileDescriptorProto(
        name=f"{package.replace('.', '/')}.proto", package=package, syntax="proto3"
    )
    fd = descriptor_pb2.FieldDescriptorProto
    for msg_name, fields in _MESSAGES:
        msg = fdp.message_type.add(name=msg_name)
        oneof, members = _ONEOFS.get(msg_name, ("", ()))
        if oneof:
            msg.oneof_decl.add(name=oneof)
        for name, number, ftype, label, ref in fields:
            if raw_events and (msg_name, name) == ("XLine", "events"):
                ftype, ref = _BYT, None
            f = msg.field.add(name=name, number=number, json_name=name)
            f.type = getattr(fd, f"TYPE_{ftype.upper()}")
            f.label = fd.LABEL_REPEATED if label == _REP else fd.LABEL_OPTIONAL
            if name in members:
                f.oneof_index = 0
            if ref:
                f.type_name = f".{package}.{ref}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.XSpace"))


def message_class(name: str) -> Any:
    """Another message class of the schema (``XEvent``, for events decoded one by one)."""
    from google.protobuf import message_factory  # as above: only when an XSpace is read

    pool = xspace_class().DESCRIPTOR.file.pool
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
