"""The checkpoint directory a vLLM engine or server starts from (no vllm import).

vLLM loads a model from a directory. A checkpoint given by ``model.path`` (or the
embedded one) is used as it is; a preset's random initial weights are saved first,
so step 0 generates with exactly the actor's weights even if no weight sync ever
reaches the engine. Tokenizer files go along, so the directory is a complete checkpoint
(both engines run on token ids and skip them).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from tunekit.config import PROMPT_TOKEN_BUDGET, Recipe
from tunekit.placement.dist import Dist

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_TOKENIZER_EXTRAS = ("merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
                     "chat_template.json")
"""A checkpoint's other tokenizer files, never linked next to a tokenizer written anew (they would mix in)."""


def has_tokenizer(path: Path) -> bool:
    return any((path / f).exists() for f in _TOKENIZER_FILES)


def export_checkpoint(model: nn.Module | None, tokenizer, *, path: str | None, out_dir: Path,
                      dtype: torch.dtype = torch.bfloat16, own_tokenizer: bool = False) -> Path:
    """The directory vLLM should load: ``path`` itself when it is complete, else one written to ``out_dir``.

    ``path`` None means ``model``'s weights are written (in ``dtype``, what the engine holds);
    a ``path`` without tokenizer files (or any ``path`` when ``own_tokenizer``: ``tokenizer`` was changed after
    loading) gets a directory of ``tokenizer``'s files plus links to the checkpoint's other files.
    """
    if path is not None:
        src = Path(path)
        if has_tokenizer(src) and not own_tokenizer:
            return src
        out_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(out_dir)  # first: a link to the checkpoint's own file is never written through
        for f in src.iterdir():
            if not (out_dir / f.name).exists() and f.name not in _TOKENIZER_FILES + _TOKENIZER_EXTRAS:
                (out_dir / f.name).symlink_to(f.resolve())
        return out_dir
    if model is None:
        raise ValueError("export_checkpoint needs a model when there is no checkpoint path")
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: (v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu())
             for k, v in model.state_dict().items()}
    # vLLM is told the dtype explicitly, so the config's (float32, from the masters) does not matter
    model.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def rollout_checkpoint(recipe: Recipe, policy: nn.Module, tokenizer, dist: Dist) -> Path:
    """The engine's checkpoint directory on every rank; rank 0 writes it once (call before sharding ``policy``).

    A directory tunekit writes is removed when rank 0's process exits (engines and
    servers have loaded it by then).
    """
    from tunekit.workload.models import EMBEDDED_MODEL_DIR

    m = recipe.model
    path = m.path or (None if m.preset else str(EMBEDDED_MODEL_DIR))
    shared = dist.world > 1 and torch.distributed.is_initialized()  # else each process writes its own
    out = None
    if dist.is_main or not shared:
        tmp = Path(tempfile.mkdtemp(prefix="tunekit-rollout-ckpt-"))
        out = export_checkpoint(policy, tokenizer, path=path, out_dir=tmp)
        if out != tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            atexit.register(shutil.rmtree, tmp, True)
    if shared:
        box = [str(out) if out is not None else None]
        torch.distributed.broadcast_object_list(box, src=0)
        out = Path(box[0])
    return Path(out)


def max_model_len(model_dir: Path | None, max_new_tokens: int, prompt_budget: int = PROMPT_TOKEN_BUDGET) -> int:
    """Context length to give the engine: room for a prompt and the response, within the model's positions (read
    from ``model_dir``'s config.json; without one, or without ``model_dir``, the room alone)."""
    import json

    path = Path(model_dir) / "config.json" if model_dir is not None else None
    cfg = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    limit = cfg.get("max_position_embeddings") or (prompt_budget + max_new_tokens)
    return int(min(limit, prompt_budget + max_new_tokens))
