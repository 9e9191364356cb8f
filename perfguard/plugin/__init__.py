"""The pytest plugin (entry point ``pytest11: perfguard``).

This release only registers the ``gpuprofile`` marker so marked tests run as
ordinary tests; capture, baselines and verdicts come with the plugin issue.
Heavy imports stay out of this module so loading the plugin costs nothing.
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "gpuprofile(iterations=30, warmup=5, tolerance='5%', metrics=('gpu_time',), "
        "key_node=None, backend=None): profile this benchmark test with perfguard.",
    )
