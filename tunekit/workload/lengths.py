"""How long the recipe's prompts are as the model is fed them: the tokenizer the loop feeds them through and the
longest one (chat template included), read once per process. The memory estimate and the cost model count it."""

from __future__ import annotations

from typing import Any

from tunekit.config import Recipe


def model_tokenizer(recipe: Recipe):
    """The tokenizer the loop feeds the model's prompts through (a pretrained preset's or a ``.gguf``'s converted
    checkpoint's), or None where it cannot be read here."""
    m = recipe.model
    key = (m.path, m.preset, m.tokenizer_path)
    if key not in _TOKENIZERS:
        from tunekit.config.errors import ConfigError
        from tunekit.workload import models
        from tunekit.workload.pretrained import resolve_model

        try:
            m = resolve_model(recipe).model
            _TOKENIZERS[key] = models.load_tokenizer(m.tokenizer_path or m.path)
        except (ConfigError, ValueError, OSError):
            _TOKENIZERS[key] = None
    return _TOKENIZERS[key]


_TOKENIZERS: dict[tuple, Any] = {}
"""A model's tokenizer, or None where it cannot be read, per model: read once per process."""


def templated_prompts(recipe: Recipe) -> bool:
    """Whether the loop renders the recipe's prompts through a chat template (``task.chat_template`` auto and a
    tokenizer that has one); False where the tokenizer cannot be read here."""
    return recipe.task.chat_template == "auto" and bool(getattr(model_tokenizer(recipe), "chat_template", None))


def longest_fed_prompt(recipe: Recipe) -> int | None:
    """The most tokens one of the recipe's prompts takes as the model is fed it
    (:func:`tunekit.workload.longest_prompt_tokens`, over its first :data:`tunekit.workload.LENGTH_ROWS` rows); None
    where the prompts or the tokenizer cannot be read here (the preflight says why)."""
    t, m = recipe.task, recipe.model
    key = (t.dataset, t.prompt_column, t.answer_column, t.prompt_template, t.chat_template, t.system_prompt,
           t.max_operand, m.path, m.preset, m.tokenizer_path)
    if key not in _LONGEST:
        _LONGEST[key] = _read_longest(recipe)
    return _LONGEST[key]


_LONGEST: dict[tuple, int | None] = {}
"""The longest prompt per prompt source, prompt format and tokenizer: read once per process."""


def _read_longest(recipe: Recipe) -> int | None:
    from tunekit.config.errors import ConfigError
    from tunekit.workload import longest_prompt_tokens

    if (tok := model_tokenizer(recipe)) is None:
        return None
    try:
        return longest_prompt_tokens(recipe.task, tok)
    except (ConfigError, ValueError, OSError):
        return None
