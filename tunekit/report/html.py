"""Small HTML helpers shared by the page's sections: number formatting, escaping into sections, JSON in script tags."""

from __future__ import annotations

import json
import math
from html import escape
from typing import Any


def json_script(obj: Any, element_id: str) -> str:
    """JSON inside <script type="application/json">, with ``<``, ``>`` and ``&`` escaped so no text ends the tag."""
    text = obj if isinstance(obj, str) else json.dumps(obj)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" id="{escape(element_id)}">{text}</script>'


def fmt(v: Any, spec: str = ".4g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return format(v, spec)
    return str(v)


def hours(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    h, m = divmod(round(seconds / 60), 60)
    return f"{h} h {m:02d} min" if h else f"{m} min" if m else f"{seconds:.0f} s"


def section(sid: str, title: str, body: str, note: str = "", *, empty: bool = False) -> str:
    """A titled section; ``empty``: a compact one whose body is the one line saying why there is nothing to show."""
    note_html = f'<p class="note">{note}</p>' if note else ""
    cls = ' class="empty-section"' if empty else ""
    return f'<section id="{sid}"{cls}><h2>{escape(title)}</h2>{note_html}{body}</section>'


def warn(text: str) -> str:
    return f'<p class="warn">{text}</p>'
