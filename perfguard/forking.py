"""Whether this process may fork: the one rule every forking part of perfguard follows.

perfguard forks for speed (the Kineto reader's second half, ``publish``'s readers and
builders, the plugin's warm fork server). A fork copies one thread; a runtime that starts
thread pools at import (JAX warns a fork "will likely lead to a deadlock"; TensorFlow's
pools likewise) is never forked, and the work runs in this process instead, with the same
results. Standard library only: the plugin's light path imports it.
"""

from __future__ import annotations

import sys

#: top-level packages whose runtimes start threads when imported
FORK_UNSAFE = frozenset({"tensorflow", "keras", "tf_keras", "tensorboard", "jax", "jaxlib"})


def can_fork() -> bool:
    """Whether worker processes may be forked from this one: not after a package of
    :data:`FORK_UNSAFE` was imported (a library caller's process, a test session that ran
    a JAX test)."""
    return not any(name in sys.modules for name in FORK_UNSAFE)
