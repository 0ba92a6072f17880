"""The checkpoint directory a framework runner (TRL, verl) loads: one home for writing it."""

from __future__ import annotations

from pathlib import Path

import torch

from tunekit.config import Recipe


def prepare_model(recipe: Recipe, tmp: Path, gpu: bool) -> Path:
    """The checkpoint directory the framework (and its vLLM) load: the recipe's, the embedded one, or a preset's
    seeded random weights written to ``tmp`` (bf16 on GPU, what the engine runs; fp32 on CPU)."""
    from tunekit import models
    from tunekit.trainer import build
    from tunekit.trainer.rollout.checkpoint import export_checkpoint

    m = recipe.model
    tok = build.load_tokenizer(recipe)
    if m.preset is None:
        return export_checkpoint(None, tok, path=m.path or str(models.EMBEDDED_MODEL_DIR), out_dir=tmp / "model")
    torch.manual_seed(recipe.probe.seed)
    policy = build.build_policy(recipe, tok)
    dtype = torch.bfloat16 if gpu and m.dtype != "float32" else torch.float32
    return export_checkpoint(policy.to(dtype), tok, path=None, out_dir=tmp / "model", dtype=dtype)
