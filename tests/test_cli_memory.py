"""The command's process-wide memory settings (perfguard.commands.memory): the
command line takes them, a library caller of ``main([...])`` does not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from numpy._core import multiarray

from perfguard.cli import main
from perfguard.commands import memory

EXAMPLE = (
    Path(__file__).resolve().parents[1]
    / "examples/captures/a100_alexnet_tiny_cudasync.pt.trace.json.gz"
)


@pytest.fixture
def huge_pages_on() -> Iterator[None]:
    """numpy's huge-page advice on for the test, the process's setting restored after."""
    before = multiarray._set_madvise_hugepage(True)
    yield
    multiarray._set_madvise_hugepage(before)


def test_the_command_stops_numpy_asking_for_huge_pages(huge_pages_on: None) -> None:
    memory._no_huge_pages()
    assert multiarray._set_madvise_hugepage(True) is False  # it was off


def test_main_called_with_arguments_leaves_the_process_alone(
    huge_pages_on: None, tmp_path: Path
) -> None:
    assert main(["analyze", "--database", str(EXAMPLE), "--output-path",
                 str(tmp_path), "--formats", "csv"]) == 0  # fmt: skip
    assert multiarray._set_madvise_hugepage(True) is True  # still on
