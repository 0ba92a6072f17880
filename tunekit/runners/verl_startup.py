"""Where a verl probe's start-up goes, read off the lines verl prints as it starts.

verl's output reaches the probe's first process line by line (:func:`tunekit.runners.verl_entry._relay`); each line
is stamped as it arrives, and the first line carrying each milestone below marks the milestone. A line written by
Python's ``logging`` (verl's own ``LEVEL:YYYY-MM-DD HH:MM:SS,mmm:message``, Ray's ``YYYY-MM-DD HH:MM:SS,mmm<TAB>INFO``)
is stamped with its own time instead, which Ray's relay of a worker's output cannot delay; a stamp that does not
fit its arrival (after it, or more than :data:`MOST_RELAY_S` before) is not believed and the arrival stands.

The milestones, in the order verl 0.9 reaches them (its V1 trainer: ``verl/trainer/main_ppo.py``, then
``TaskRunnerV1.run`` calling ``PPOTrainer.init`` in ``verl/trainer/ppo/v1/trainer_base.py``, whose ``_setup`` logs
each stage it finished):

=====================  ===============================================  ==============================================
milestone              the line                                         printed by
=====================  ===============================================  ==============================================
``ray_init``           ``ray init kwargs: {...}``                       ``run_ppo`` (main_ppo.py), before ``ray.init``
``ray_started``        ``Started a local Ray instance.``                Ray's ``ray.init`` (``ray/_private/worker.py``)
``setup_done``         ``worker group kwargs: {...}``                   ``_setup``: tokenizer, dataloader and resource
                                                                        pools done, worker groups next
``models_loaded``      ``actor and ref model engine initialized``       ``_setup``: ``init_model`` of the actor (and
                                                                        reference) worker group returned
``reward_ready``       ``reward loop manager initialized``              ``_setup``: reward loop workers started
``servers_ready``      ``LLMServerManager: [addresses]``                ``LLMServerManager._initialize_llm_servers``
                                                                        (``verl/workers/rollout/llm_server.py``):
                                                                        every vLLM server replica is up
``ready_to_fit``       ``all initialize finished, ready to fit``        ``_setup``'s last line: the checkpoint engine
                                                                        built, the servers put to sleep
``validated_before``   ``Initial validation metrics: {...}``            ``fit``, after the validation before training
                                                                        (``trainer.val_before_train``)
=====================  ===============================================  ==============================================

Each part of :data:`PARTS` runs from one milestone to the next; it is written only when both were seen in order
(a part whose milestones never appeared is left out, its time stays in ``startup/other_s``); a part listed twice
takes the later pair where both of its milestones were seen. The probe's own
marks frame them: ``spawned`` (verl's process started) and the first step's start (its step line's arrival less its
``timing_s/step``). vLLM's own start-up lines are not used: verl starts its servers with ``VLLM_LOGGING_LEVEL=WARN``.
"""

from __future__ import annotations

import re
import time

SPAWNED = "spawned"
FIRST_STEP = "first_step"
MILESTONES = (
    ("ray_init", "ray init kwargs: "),
    ("ray_started", "Started a local Ray instance"),
    ("setup_done", "worker group kwargs: "),
    ("models_loaded", "actor and ref model engine initialized"),
    ("reward_ready", "reward loop manager initialized"),
    ("servers_ready", "LLMServerManager: ["),
    ("ready_to_fit", "all initialize finished, ready to fit"),
    ("validated_before", "Initial validation metrics: "),
)
"""(milestone, the text of verl's (or Ray's) line that marks it), in the order verl reaches them."""
PARTS = (
    ("imports", SPAWNED, "ray_init"),
    ("ray_start", "ray_init", "ray_started"),
    ("setup", "ray_started", "setup_done"),
    ("model_load", "setup_done", "models_loaded"),
    ("reward_workers", "models_loaded", "reward_ready"),
    ("engine_start", "reward_ready", "servers_ready"),
    ("weight_sync_setup", "servers_ready", "ready_to_fit"),
    ("before_first_step", "ready_to_fit", FIRST_STEP),
    ("eval_before", "ready_to_fit", "validated_before"),
    ("before_first_step", "validated_before", FIRST_STEP),
)
"""(part, from milestone, to milestone): written as ``startup/<part>_s`` (:mod:`tunekit.metrics`)."""
MOST_RELAY_S = 30.0
"""The longest a logged line's own stamp is believed to precede its arrival (Ray relays worker output within a
second; a larger gap is a clock or time zone the stamp does not share)."""
_LOGGED_AT = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")


def logged_at(line: str, arrived: float) -> float:
    """When ``line`` was written: the stamp Python's logging put in it (local time, as this machine's processes
    share), else ``arrived``; a stamp after the arrival or more than :data:`MOST_RELAY_S` before it is ignored."""
    m = _LOGGED_AT.search(line)
    if m is None:
        return arrived
    try:
        stamp = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
    except (ValueError, OverflowError):
        return arrived
    return stamp if 0.0 <= arrived - stamp <= MOST_RELAY_S else arrived


class StartupLines:
    """The milestones of verl's start-up, from its output as it arrives (:meth:`see`), as start-up parts
    (:meth:`parts`)."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}
        """milestone -> when it was written (``time.time()``), the first line that carried it."""

    def mark(self, milestone: str, at: float | None = None) -> None:
        """A milestone the probe itself knows (e.g. :data:`SPAWNED`), at ``at`` (default now); the first mark stays."""
        self.seen.setdefault(milestone, time.time() if at is None else at)

    def see(self, line: str, arrived: float | None = None) -> None:
        """One line of verl's output, arrived at ``arrived`` (default now)."""
        for milestone, text in MILESTONES:
            if milestone not in self.seen and text in line:
                self.mark(milestone, logged_at(line, time.time() if arrived is None else arrived))

    def parts(self, first_step: float | None) -> dict[str, float]:
        """part -> seconds, for the parts of :data:`PARTS` whose two milestones were both seen, in order;
        ``first_step``: when the first step began (None: no step, no ``before_first_step``)."""
        seen = dict(self.seen)
        if first_step is not None:
            seen[FIRST_STEP] = first_step
        return {part: seen[end] - seen[start] for part, start, end in PARTS
                if start in seen and end in seen and seen[end] >= seen[start]}
