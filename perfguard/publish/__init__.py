"""``perfguard publish``: a store as a static, offline site of every test's history.

:func:`publish` is the library call; :mod:`.data` reads the store's index and
then, in bulk, the records of the pages to rebuild, :mod:`.series` cuts them
per machine and test and finds the change points with the compare layer's
detectors, :mod:`.charts` and :mod:`.pages` write the SVG and HTML,
:mod:`.site` builds only the pages whose content changed, in parallel.
"""

from __future__ import annotations

from perfguard.publish.site import Published, publish

__all__ = ["Published", "publish"]
