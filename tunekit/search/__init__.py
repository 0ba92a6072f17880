"""The search: Optuna over a recipe's space for the cheapest configuration whose reward reaches the threshold.

Modules: ``setup`` (checks, the study), ``objective`` (one trial = one probe), ``budget`` (spend),
``space`` (the recipe's search space), ``storage`` (where the study lives, recovery), ``learning``
(systems knobs must not change learning), ``result`` (search.json), ``view`` (the terminal).
"""

from tunekit.search.result import SearchResult
from tunekit.search.run import run_search

__all__ = ["SearchResult", "run_search"]
