"""Readers that turn a raw capture into the :class:`Trace` model."""

from perfguard.trace.loader import load_trace
from perfguard.trace.model import SCHEMA, Trace

__all__ = ["SCHEMA", "Trace", "load_trace"]
