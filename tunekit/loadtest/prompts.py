"""The prompts a load test sends: the recipe's workload (or one text given), each rendered the way tunekit's
trainer feeds it to the model, through the tokenizer's chat template (``task.chat_template``)."""

from __future__ import annotations

import random

from tunekit.config import Recipe
from tunekit.workload import build_workload


def prompt_texts(recipe: Recipe, *, text: str | None = None) -> list[str]:
    """``loadtest.prompts`` prompts drawn from the recipe's workload with its seed (``text`` alone when given), as
    rendered text. A tokenizer that does not load raises ConfigError naming its key."""
    from tunekit.launch.preflight import tokenizer_of
    from tunekit.workload.chat import prompt_format

    tokenizer = tokenizer_of(recipe)
    fmt = prompt_format(recipe.task, tokenizer)
    texts = [text] if text is not None else [
        p.text for p in build_workload(recipe.task).sample(recipe.loadtest.prompts, random.Random(recipe.probe.seed))]
    return [fmt.render(tokenizer, t) for t in texts]
