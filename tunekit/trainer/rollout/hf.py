"""Rollout with Hugging Face ``generate``: the CPU default and the baseline on GPU."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from tunekit.config import Recipe
from tunekit.trainer.batch import Batch
from tunekit.trainer.parallel import eager_forward


class HFRollout:
    """Samples responses with ``model.generate``.

    ``model`` is either the actor's own (FSDP-sharded) module, so no weight sync is
    needed, or a separate copy that :meth:`sync_weights` refreshes after each update.
    """

    @staticmethod
    def preflight(recipe: Recipe, cuda_count: int) -> None:
        """HF generate needs nothing the trainer does not."""

    def __init__(self, *, model: nn.Module, device: torch.device, pad_id: int, eos_id: int, max_new_tokens: int,
                 temperature: float, fixed_length: bool, shares_actor: bool, synced: bool = False) -> None:
        self.model, self.device = model, device
        self.pad_id, self.eos_id = pad_id, eos_id
        self.max_new_tokens, self.temperature, self.fixed_length = max_new_tokens, temperature, fixed_length
        self.shares_actor = shares_actor
        self.synced = synced  # FSDP ranks must step together until every rank is done

    @torch.no_grad()
    def generate(self, prompts: Batch, *, seed: int, greedy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample one response per prompt row (``greedy``: the most likely one). Returns (response_ids [B,R],
        logprobs [B,R]), R = max_new_tokens."""
        torch.manual_seed(seed)
        self.model.eval()
        ids = prompts["prompt_ids"].to(self.device)
        mask = prompts["prompt_mask"].to(self.device)
        with eager_forward(self.model) as model:  # the actor's compiled forward serves training, not decoding
            out = model.generate(
                input_ids=ids, attention_mask=mask, **({"do_sample": False} if greedy else
                                                       {"do_sample": True, "temperature": self.temperature, "top_k": 0, "top_p": 1.0}),
                max_new_tokens=self.max_new_tokens, min_new_tokens=self.max_new_tokens if self.fixed_length else 0,
                pad_token_id=self.pad_id, eos_token_id=self.eos_id, output_scores=True, return_dict_in_generate=True,
                synced_gpus=self.synced,
            )
        resp = out.sequences[:, ids.shape[1]:]
        logp = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in out.scores], dim=1)
        logp = logp.gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        pad = self.max_new_tokens - resp.shape[1]
        if pad:
            resp = torch.nn.functional.pad(resp, (0, pad), value=self.pad_id)
            logp = torch.nn.functional.pad(logp, (0, pad), value=0.0)
        return resp.cpu(), logp.cpu()

    def sync_weights(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy new actor weights into a separate rollout model; returns bytes moved."""
        if self.shares_actor:
            return 0
        own = dict(self.model.named_parameters())
        own.update(dict(self.model.named_buffers()))
        moved = 0
        with torch.no_grad():
            for name, tensor in named_params:
                if name in own:
                    own[name].copy_(tensor.to(own[name].device, own[name].dtype))
                    moved += tensor.numel() * tensor.element_size()
        return moved

    def sleep(self) -> None:
        """HF generate holds no cache between calls; nothing to free."""

    def wake(self) -> None:
        """Nothing to restore."""

