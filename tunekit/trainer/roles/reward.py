"""The reward: the workload's reward function, or a sequence-classification reward model."""

from __future__ import annotations

import torch

from tunekit.workload.base import Prompt


class RuleReward:
    """Scores decoded completions with the workload's reward function (``task.reward``)."""

    def __init__(self, task) -> None:
        self.task = task

    def score(self, prompts: list[Prompt], completions: list[str]) -> torch.Tensor:
        return torch.tensor([self.task.score(p, c) for p, c in zip(prompts, completions)], dtype=torch.float32)


class ModelReward:
    """Scores ``prompt + completion`` text with a local reward model (``tunekit.workload.models.RewardModel``)."""

    def __init__(self, reward_model, tokenizer, device: torch.device) -> None:
        self.model, self.tokenizer, self.device = reward_model.to(device).eval(), tokenizer, device

    @torch.no_grad()
    def score(self, prompts: list[Prompt], completions: list[str]) -> torch.Tensor:
        texts = [p.text + c for p, c in zip(prompts, completions)]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True).to(self.device)
        return self.model(**enc).float().cpu()
