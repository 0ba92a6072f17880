"""The reward: the workload's reward function, or a sequence-classification reward model."""

from __future__ import annotations

import torch

from tunekit.workload.base import Prompt
from tunekit.workload.reward import extra_sums


class RuleReward:
    """Scores decoded completions with the workload's reward function (``task.reward``); :attr:`last_extra` keeps
    what the last call's dict returns gave beside their score (:func:`tunekit.workload.reward.extra_sums`)."""

    def __init__(self, task) -> None:
        self.task = task
        self.last_extra: dict[str, tuple[float, int]] = {}

    def score(self, prompts: list[Prompt], completions: list[str]) -> torch.Tensor:
        scores = self.task.scores(prompts, completions)
        self.last_extra = extra_sums(scores)
        return torch.tensor([s.value for s in scores], dtype=torch.float32)


class ModelReward:
    """Scores ``prompt + completion`` text with a local reward model (``tunekit.workload.models.RewardModel``)."""

    def __init__(self, reward_model, tokenizer, device: torch.device) -> None:
        self.model, self.tokenizer, self.device = reward_model.to(device).eval(), tokenizer, device

    @torch.no_grad()
    def score(self, prompts: list[Prompt], completions: list[str]) -> torch.Tensor:
        texts = [p.text + c for p, c in zip(prompts, completions)]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True).to(self.device)
        return self.model(**enc).float().cpu()
