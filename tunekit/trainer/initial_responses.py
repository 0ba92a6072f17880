"""How long responses run before any probe measured them: the initial policy's answers to the first step's prompts.

What generating and decoding a step costs follows the tokens its responses hold, which only the model can tell: the
cost model charges the ``task.max_new_tokens`` budget until a probe of the workload measured their length.
:func:`sample_responses` asks the model instead. It draws the first step's prompts with the probe's seed, the first
``prompts`` of them each ``samples_per_prompt`` times, renders them as tunekit's trainer feeds them (the chat template,
``task.chat_template``) and samples with Hugging Face ``generate`` at the task's temperature and budget, as the
trainer's HF rollout does, on this machine's GPU when it has one, else its CPU. With every prompt of a step of at most
:data:`CHUNK_ROWS` responses (one ``generate`` call) on the trainer's own device, they are that step's responses.

Training moves the length (on ``smollm2-arith`` its mean went from 23.6 tokens at the first step to 10.8 by the
twentieth, as the policy learned to answer with the number alone), so a sampled length prices the run as it starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tunekit.config import Recipe
from tunekit.config.errors import ConfigError
from tunekit.trainer import build
from tunekit.trainer.batch import encode_prompts, response_mask
from tunekit.trainer.rollout.hf import HFRollout
from tunekit.workload.chat import prompt_format
from tunekit.workload.seeds import step_rng, step_seed

CHUNK_ROWS = 256
"""Responses generated in one ``generate`` call (a larger sample runs as several, each seeded apart)."""


@dataclass(frozen=True)
class ResponseSample:
    tokens: float
    """The responses' mean length in tokens, up to and including the end-of-sequence token, as a step records
    ``response_length/mean``."""
    responses: int
    device: str
    seconds: float

    @property
    def source(self) -> str:
        """How the length was found, as a clause of the estimate's assumptions."""
        return (f"as {self.responses} responses of the initial policy to the first step's prompts measured them "
                f"(sampled on {self.device}; training moves it)")


def sample_responses(recipe: Recipe, prompts: int) -> ResponseSample:
    """The mean length of the initial policy's responses to the first ``prompts`` of the first step's prompts, each
    sampled ``samples_per_prompt`` times; ConfigError when ``prompts`` is outside 1..``prompts_per_step``."""
    b = recipe.system.batch
    if not 1 <= prompts <= b.prompts_per_step:
        raise ConfigError(f"--sample-responses {prompts}: give a number of the first step's prompts from 1 to "
                          f"system.batch.prompts_per_step ({b.prompts_per_step}).")
    start = time.perf_counter()
    device = torch.device("cuda" if recipe.system.device != "cpu" and torch.cuda.is_available() else "cpu")
    tokenizer = build.load_tokenizer(recipe)
    policy = build.build_policy(recipe, tokenizer, device)
    rollout = HFRollout(model=policy, device=device, shares_actor=True, **build.rollout_kwargs(recipe, tokenizer))
    fmt = prompt_format(recipe.task, tokenizer)
    first = build.build_task(recipe).sample(b.prompts_per_step, step_rng(recipe.probe.seed, 0))[:prompts]
    texts = [fmt.render(tokenizer, p.text) for p in first for _ in range(b.samples_per_prompt)]
    lengths = []
    for at in range(0, len(texts), CHUNK_ROWS):
        ids, _ = rollout.generate(encode_prompts(tokenizer, texts[at:at + CHUNK_ROWS]), seed=step_seed(recipe.probe.seed, at))
        lengths += response_mask(ids, tokenizer.eos_token_id).sum(-1).tolist()
    return ResponseSample(sum(lengths) / len(lengths), len(lengths), device.type, time.perf_counter() - start)
