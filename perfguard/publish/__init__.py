"""``perfguard publish``: a store as a static, offline site of every test's history.

:func:`publish` is the library call; :mod:`.data` reads the store in one
query per table, :mod:`.series` cuts it per machine and test and finds the
change points with the compare layer's detectors, :mod:`.charts` and
:mod:`.pages` write the SVG and HTML, :mod:`.site` builds only the pages whose
content changed.
"""

from __future__ import annotations

from perfguard.publish.site import Published, publish

__all__ = ["Published", "publish"]
