"""``--json [FILE]``: a command's answer as a versioned document.

The documents are :mod:`perfguard.compare.documents`'s.

Without FILE (or with ``-``) the document is the command's whole standard
output, so ``perfguard history --json | jq`` reads it; with FILE it is written
there and the command prints its usual text.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from perfguard.errors import PerfguardError

STDOUT = "-"


def add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    """Add ``--json [FILE]`` (dest ``json_out``) to ``parser``."""
    parser.add_argument(
        "--json",
        dest="json_out",
        nargs="?",
        const=STDOUT,
        metavar="FILE",
        help=f"write {what} as a versioned JSON document to FILE, or to stdout "
        "(instead of the text) without FILE or with -",
    )


def to_stdout(args: argparse.Namespace) -> bool:
    """Whether the document replaces the command's text on stdout."""
    return getattr(args, "json_out", None) == STDOUT


def write_json(doc: dict[str, Any], target: str) -> None:
    """``doc`` to ``target`` (a path, or ``-`` for stdout); a one-line error if it cannot."""
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    if target == STDOUT:
        sys.stdout.write(text)
        return
    try:
        Path(target).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PerfguardError(f"{target}: cannot write: {exc.strerror or exc}") from None
