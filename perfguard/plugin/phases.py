"""The one clock of a test's and a session's parts (:mod:`perfguard.core.phases`), where
the plugin's outputs and summary read it."""

from perfguard.core.phases import OWN_PHASES, timed

__all__ = ["OWN_PHASES", "timed"]
