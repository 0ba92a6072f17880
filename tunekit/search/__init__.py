"""The search: Optuna over a recipe's space for the cheapest configuration whose reward reaches the threshold.

Modules: ``setup`` (checks, the study), ``objective`` (one trial = one probe), ``budget`` (spend),
``space`` (the recipe's search space), ``storage`` (where the study lives, recovery), ``learning``
(systems knobs must not change learning), ``result`` (search.json), ``view`` (the terminal).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SearchResult", "run_search"]


def __getattr__(name: str) -> Any:
    """``run_search`` and ``SearchResult`` on first use: ``tunekit.search.checks`` is imported without the trainer."""
    if name == "run_search":
        from tunekit.search.run import run_search

        return run_search
    if name == "SearchResult":
        from tunekit.search.result import SearchResult

        return SearchResult
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
