"""The nsys options perfguard's nsys backend passes, as NVIDIA documents them per release.

A reference for the tests (issue 45): the argv :mod:`perfguard.capture.nsys` builds is
read here by nsys's documented syntax and checked against each release's documented
options, instead of against a list the tests wrote themselves; the fake ``nsys`` of the
plugin tests refuses what a release does not document, as nsys would.

Syntax (the "Command Line Options" section of every User Guide below): "when short
options are used, the parameters should follow the switch after a space; e.g. -s
process-tree. When long options are used, the switch should be followed by an equal
sign and then the parameter(s); e.g. --sample=process-tree." Options come before the
application and its own arguments.

Sources, one per release checked (``../shared/reference/nsys_schema.md`` section 8 has
the wider table, with the meaning of each option):

* 2022.1: https://docs.nvidia.com/nsight-systems/2022.1/UserGuide/index.html, "CLI
  Profile Command Switch Options" and "CLI Export Command Switch Options"; the first
  User Guide whose reports are ``.nsys-rep`` (the reference's [F] note on ``-o``).
* 2022.2: https://docs.nvidia.com/nsight-systems/2022.2/pdf/UserGuide.pdf, v2022.2.1,
  sections 1.3.1 (profile) and 1.3.7 (export); the release that exported the MPI saxpy
  fixture the plugin tests feed their fake.
* 2024.1: https://docs.nvidia.com/nsight-systems/2024.1/UserGuide, same sections.
* 2026.2: https://docs.nvidia.com/nsight-systems/UserGuide/index.html (the reference's
  D5, the current guide when it was written; 2026.2.1 exported the torchrun fixture).

Only the options perfguard passes are listed, each with the values perfguard may give
it that the guide lists (``None``: any value, a path or a number); an option or value
missing from a release's table is one that release does not document. Releases before
2022.1 (``.qdrep`` reports) are not in the table: their guides are not in the reference,
and scripts of that era end a capture range with ``--stop-on-range-end=true`` (the
reference's S6), which perfguard does not pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: long name -> (short name or None, the documented values perfguard may pass, or None)
Options = dict[str, tuple[str | None, frozenset[str] | None]]

_PROFILE_2022: Options = {
    # -t/--trace: "cuda, nvtx, osrt, ..., none"; perfguard traces CUDA and NVTX (DLProf's set)
    "trace": ("t", frozenset({"cuda", "nvtx", "osrt", "cublas", "cudnn", "opengl", "none"})),
    # -s/--sample: "none" disables CPU sampling
    "sample": ("s", frozenset({"none"})),
    "output": ("o", None),
    # -f/--force-overwrite: "true, false"
    "force-overwrite": ("f", frozenset({"true", "false"})),
    # --export: "sqlite, hdf, json, text, none" (2022); no short form
    "export": (None, frozenset({"sqlite", "hdf", "json", "text", "none"})),
    "delay": ("y", None),  # -y/--delay: seconds
    "duration": ("d", None),  # -d/--duration: seconds
    # -c/--capture-range: "none, cudaProfilerApi, hotkey, nvtx"
    "capture-range": ("c", frozenset({"none", "cudaProfilerApi", "hotkey", "nvtx"})),
    # --capture-range-end: "none, stop, stop-shutdown, repeat[:N]"
    "capture-range-end": (None, frozenset({"none", "stop", "stop-shutdown", "repeat"})),
    "nvtx-capture": ("p", None),  # -p/--nvtx-capture: range@domain
}
_PROFILE_2024: Options = {
    **_PROFILE_2022,
    # the export types grew (arrow, parquet); sqlite is the one perfguard asks for
    "export": (None, frozenset({"sqlite", "hdf", "json", "text", "arrow", "none"})),
    # ... and so did the range ends (repeat-shutdown:N)
    "capture-range-end": (
        None,
        frozenset({"none", "stop", "stop-shutdown", "repeat", "repeat-shutdown"}),
    ),
}
_PROFILE_2026: Options = {
    **_PROFILE_2024,
    "export": (
        None,
        frozenset(
            {
                "sqlite",
                "hdf",
                "json",
                "text",
                "arrow",
                "arrowdir",
                "parquetdir",
                "jsonlines",
                "none",
            }
        ),
    ),
}
# nsys export: -t/--type (sqlite among others), -o/--output, -f/--force-overwrite
_EXPORT: Options = {
    "type": ("t", frozenset({"sqlite", "hdf", "json", "text"})),
    "output": ("o", None),
    "force-overwrite": ("f", frozenset({"true", "false"})),
}

#: release -> command -> its documented options
DOCUMENTED: dict[str, dict[str, Options]] = {
    "2022.1": {"profile": _PROFILE_2022, "export": _EXPORT},
    "2022.2": {"profile": _PROFILE_2022, "export": _EXPORT},
    "2024.1": {"profile": _PROFILE_2024, "export": _EXPORT},
    "2026.2": {"profile": _PROFILE_2026, "export": _EXPORT},
}


@dataclass(frozen=True)
class Command:
    """An nsys argv read by the documented syntax."""

    command: str
    options: dict[str, str]  # long name -> value
    rest: list[str]  # the application and its arguments (export: the report)


class Undocumented(ValueError):
    """An argv that a release's User Guide does not document."""


def read_argv(argv: Sequence[str], release: str) -> Command:
    """``[nsys, command, options..., rest...]`` read as ``release`` documents it; raises
    :class:`Undocumented` naming the first option, value or spelling it does not."""
    if len(argv) < 2 or argv[1] not in DOCUMENTED[release]:
        raise Undocumented(f"nsys {release}: no command {argv[1:2]}")
    spec = DOCUMENTED[release][argv[1]]
    by_short = {short: name for name, (short, _) in spec.items() if short}
    options: dict[str, str] = {}
    i = 2
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if name not in spec:
                raise Undocumented(f"nsys {release} {argv[1]}: no option --{name}")
            if not eq:
                raise Undocumented(f"nsys {release}: long option --{name} takes '=VALUE'")
            i += 1
        else:
            if arg[1:] not in by_short:
                raise Undocumented(f"nsys {release} {argv[1]}: no option {arg}")
            if i + 1 >= len(argv):
                raise Undocumented(f"nsys {release}: {arg} needs a value")
            name, value = by_short[arg[1:]], argv[i + 1]
            i += 2
        values = spec[name][1]
        # list values are comma-separated (-t cuda,nvtx); a repeat count follows a colon
        for item in value.split(",") if name == "trace" else [value.split(":")[0]]:
            if values is not None and item not in values:
                raise Undocumented(f"nsys {release}: --{name} does not take {item!r}")
        if name in options:
            raise Undocumented(f"nsys {release}: --{name} given twice")
        options[name] = value
    return Command(argv[1], options, list(argv[i:]))
