"""The trained policy as a Hugging Face checkpoint at a probe's end (``probe.save_policy``).

Every rank of the actor takes part in gathering its full weights (FSDP's all-gathers, one parameter at a time); the
process that holds them (rank 0, or the single controller's driver) builds the model's class on the meta device,
takes the gathered tensors as its parameters, and lets transformers write the checkpoint (tied weights, the config's
architecture and dtype), with the tokenizer beside it. The directory appears whole or not at all.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import torch

from tunekit import rundir
from tunekit.config import Recipe
from tunekit.placement.dist import Dist


def gathered(recipe: Recipe, named_params: Iterable[tuple[str, torch.Tensor]], dist: Dist) -> dict[str, torch.Tensor] | None:
    """The full weights on CPU in the rollout's dtype (bf16 on GPU) on rank 0, None on the others; every rank
    iterates ``named_params`` (the gathers are collectives)."""
    from tunekit.trainer.build import replica_dtype

    dtype = replica_dtype(recipe, dist.device)
    out = {}
    for name, tensor in named_params:
        if dist.is_main:
            out[name] = tensor.detach().to("cpu", dtype=dtype, copy=True)
    return out if dist.is_main else None


def write_policy(recipe: Recipe, state: dict[str, torch.Tensor], tokenizer, run_dir: Path) -> Path:
    """``state`` (every parameter of the policy, by name) written as the run directory's policy checkpoint."""
    from transformers import AutoModelForCausalLM

    from tunekit.workload.models import causal_lm_config

    m = recipe.model
    config = causal_lm_config(m.path, m.preset, m.trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=m.trust_remote_code)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    tied = {k for k in missing if getattr(config, "tie_word_embeddings", False) and k.endswith("lm_head.weight")}
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"the trained weights do not fit the model's class: missing {sorted(set(missing) - tied)[:5]}, "
                           f"unexpected {sorted(unexpected)[:5]}")
    model.tie_weights()  # the gathered copies of tied weights are one tensor again
    out = Path(run_dir) / rundir.POLICY
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(out)
    return out
