"""The checkpoint directory a framework runner (TRL, verl) loads: one home for writing it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from tunekit.config import Recipe

PLAIN_CHAT_TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"
"""A conversation as its messages' text, one after another: no roles, special tokens or generation prompt, so a
framework that renders every prompt as a chat feeds the ids tunekit's own loop feeds for the prompt's text."""
NEWLINE = "\n"
MODEL_COPY = "model"
"""The checkpoint :func:`prepare_model` writes, under the directory it is given."""


def prepare_model(recipe: Recipe, tmp: Path, gpu: bool, *, chat_rollout: bool = False) -> Path:
    """The checkpoint directory the framework (and its vLLM) load: the recipe's, the embedded one, or a preset's
    seeded random weights written to ``tmp`` (bf16 on GPU, what the engine runs; fp32 on CPU).

    ``chat_rollout`` is for a framework whose rollout renders prompts through the tokenizer's chat template and
    needs a one-token newline (verl's agent loop): the directory's tokenizer gets what :func:`chat_ready` adds. A
    checkpoint whose tokenizer needs nothing is used as it is; otherwise the tokenizer is written next to links to
    the checkpoint's other files."""
    from tunekit.workload import models
    from tunekit.trainer import build
    from tunekit.trainer.rollout.checkpoint import export_checkpoint

    m = recipe.model
    tok = build.load_tokenizer(recipe)
    changed = chat_rollout and chat_ready(tok)
    if m.preset is None:
        return export_checkpoint(None, tok, path=m.path or str(models.EMBEDDED_MODEL_DIR), out_dir=tmp / MODEL_COPY,
                                 own_tokenizer=changed)
    torch.manual_seed(recipe.probe.seed)
    policy = build.build_policy(recipe, tok)
    dtype = torch.bfloat16 if gpu and m.dtype != "float32" else torch.float32
    return export_checkpoint(policy.to(dtype), tok, path=None, out_dir=tmp / MODEL_COPY, dtype=dtype)


def handback_model(recipe: Recipe) -> str:
    """The checkpoint a handed-back command (a TRL script, verl's command) loads: the converted checkpoint's real
    directory for a pretrained preset or a ``.gguf`` file, the recipe's ``model.path``, the embedded checkpoint, or a
    placeholder for a random-init shape preset (whose weights no directory holds)."""
    from tunekit.workload import models
    from tunekit.workload.pretrained import checkpoint, converts

    m = recipe.model
    if converts(m):
        return str(checkpoint(m))
    if m.preset:
        return f"<your {m.preset} checkpoint directory>"
    return m.path or str(models.EMBEDDED_MODEL_DIR)


def needs_own_copy(recipe: Recipe) -> bool:
    """Whether verl's rollout needs a copy of the recipe's checkpoint with :func:`chat_ready`'s tokenizer (what
    :func:`prepare_model` writes with ``chat_rollout``): a ``model.path`` or the embedded checkpoint whose tokenizer
    lacks what verl asks; never a preset (a converted checkpoint's tokenizer has it, a shape preset's checkpoint is
    the user's)."""
    from tunekit.trainer import build
    from tunekit.workload.pretrained import converts

    if recipe.model.preset or converts(recipe.model):
        return False
    return chat_ready(build.load_tokenizer(recipe))


def chat_ready(tokenizer) -> bool:
    """Give ``tokenizer`` what verl's agent loop asks of it; True when anything was added.

    - No chat template: :data:`PLAIN_CHAT_TEMPLATE`, so the rendered prompt is the prompt's text (a checkpoint's
      own template is kept).
    - A newline that does not encode to exactly one token (the embedded character tokenizer drops it): a
      non-special added token for it. verl builds its Qwen boundary handling for every ``qwen2`` model, and that
      needs the newline's id to close a ChatML turn (``<|im_end|>`` then newline) when a multi-turn rollout
      appends a message. The id is only ever inserted between turns, never in a single-turn probe; it lies past
      the embedded model's 19 embedding rows (a preset's vocabulary of 151,936 rows or more holds it, and verl's
      vLLM server, which masks the logits past ``len(tokenizer)``, then lets a preset sample it). Text that
      contains a newline now tokenizes to it, so :func:`check_prompt_ids` refuses such prompts.
    """
    changed = False
    if not tokenizer.chat_template:
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
        changed = True
    if len(tokenizer.encode(NEWLINE, add_special_tokens=False)) != 1:
        tokenizer.add_tokens([NEWLINE])
        changed = True
        if len(tokenizer.encode(NEWLINE, add_special_tokens=False)) != 1:
            raise ValueError("the tokenizer does not encode a newline to one token even with it added as a token")
    return changed


def check_prompt_ids(recipe: Recipe, model_dir: Path, texts: Iterable[str]) -> None:
    """Raise ConfigError when a prompt tokenizes differently with ``model_dir``'s tokenizer (what the framework
    loads) than with the recipe's (what tunekit's own loop feeds): a probe would then train on other inputs."""
    from transformers import AutoTokenizer

    from tunekit.config.errors import ConfigError
    from tunekit.trainer import build

    ours = build.load_tokenizer(recipe)
    theirs = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    for text in dict.fromkeys(texts):
        if ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False):
            continue
        if NEWLINE in text:
            raise ConfigError(
                f"the prompt {text!r} has a newline, which the recipe's tokenizer drops but the framework's copy "
                "of it keeps as a token (see chat_ready): remove the newlines from task.dataset / "
                "task.prompt_template, or set model.tokenizer_path to a tokenizer with a newline token")
        raise ConfigError(
            f"the prompt {text!r} tokenizes differently with the tokenizer in {model_dir} than with the recipe's "
            "model.tokenizer_path: leave model.tokenizer_path unset or point it at the checkpoint's own tokenizer")
