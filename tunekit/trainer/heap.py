"""The Python heap of a training process: settle it once the warm-up has built what the run keeps.

torch.compile (dynamo's graphs and guards, Inductor's kernels), the model and an in-process engine leave
hundreds of thousands of long-lived Python objects. Every full garbage collection walks them all, and a
host-bound loop such as an eager decode pays for it at random steps. vLLM freezes its heap after its own
start-up for this reason; a warm-up step ends the same way here.
"""

from __future__ import annotations

import gc


def freeze_heap() -> int:
    """Collect garbage, then move every surviving object into the permanent generation, which later
    collections skip. Returns how many objects are frozen now. Call it after steps that built long-lived
    state (the warm-up, where compilation happens): what is frozen is never collected."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def freeze_after_warmup(steps_done: int, warmup_steps: int) -> None:
    """Freeze the heap after each of the first ``warmup_steps`` steps (``steps_done`` counts the one just
    finished): compilation and caches are built by then, and later collections skip them."""
    if steps_done <= warmup_steps:
        freeze_heap()
