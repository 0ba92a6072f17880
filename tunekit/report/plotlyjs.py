"""The plotly.js a report inlines: plotly.js's own basic partial bundle, or the full bundle when versions differ.

The report draws only ``scatter`` and ``bar`` traces (with shapes, annotations and
subplots, which every bundle has), so ``plotly-basic.min.js`` — npm
``plotly.js-basic-dist-min`` (traces bar, pie, scatter; MIT licence, text in
``plotly-basic.LICENSE``) — draws all of it at a quarter of the full bundle's size.
The package keeps it gzipped (``plotly-basic.min.js.gz``); a report inlines it as it is.
It is used only when its major.minor version is the one plotly.py was built against
(patch releases fix bugs, they add no attributes): figure JSON from another plotly.py
may use attributes an older bundle does not know.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import plotly.offline

BUNDLE = Path(__file__).with_name("plotly-basic.min.js.gz")
BUNDLE_VERSION = "4.1.1"
"""npm ``plotly.js-basic-dist-min@4.1.1``, the plotly.js that plotly.py 7.1 bundles; update both together."""
TRACES = frozenset({"scatter", "bar"})
"""Trace types the report draws; all in the basic bundle."""


def bundle_version(js: str) -> str | None:
    """The version in a plotly.js bundle's header comment (``plotly.js (basic - minified) v4.1.1``)."""
    m = re.search(r"plotly\.js[^\n]*? v(\d+\.\d+\.\d+)", js[:300])
    return m.group(1) if m else None


def same_minor(a: str, b: str) -> bool:
    return a.split(".")[:2] == b.split(".")[:2]


def plotly_js(installed: str | None = None) -> tuple[str, str]:
    """The script to inline and what it is: the basic bundle when it matches ``installed`` (plotly.py's plotly.js)."""
    installed = installed or plotly.offline.get_plotlyjs_version()
    if same_minor(installed, BUNDLE_VERSION) and BUNDLE.exists():
        return gzip.decompress(BUNDLE.read_bytes()).decode("utf-8"), f"plotly.js {BUNDLE_VERSION} basic bundle"
    return plotly.offline.get_plotlyjs(), f"plotly.js {installed} full bundle"
