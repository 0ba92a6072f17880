"""A recipe's workload as verl reads it: RL parquet files, and its reward as verl's custom reward function.

verl's ``RLHFDataset`` reads one row per prompt with the columns ``data_source``, ``prompt`` (a chat: a list of
``{"role", "content"}`` messages), ``ability``, ``reward_model`` (``{"ground_truth", "style"}``) and
``extra_info``. tunekit writes the prompts its own loop would sample at each step, in step order (verl reads them
unshuffled, ``data.shuffle=false``), each as the conversation :mod:`tunekit.workload.chat` makes of it (which verl
renders through the tokenizer's chat template itself), with the row's ``data_source`` and ``extra_info``
(:class:`tunekit.workload.Prompt`); the prompt text also travels in ``extra_info[PROMPT_KEY]``, where the reward
adapter (:mod:`tunekit.runners.verl_reward`) takes it out again.

``python -m tunekit.runners.verl_data RECIPE OUT_DIR --steps N`` writes the files of a full run (the handback's
first half).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from tunekit.config import Recipe, load_recipe
from tunekit.runners.verl import TRAIN, VAL
from tunekit.runners.verl_reward import PROMPT_KEY
from tunekit.workload import Prompt, build_workload
from tunekit.workload.chat import PromptFormat, prompt_format

VAL_ROWS = 4
"""verl builds a validation loader even when it never validates (``trainer.test_freq=-1``): a few rows."""
ABILITY = "tunekit"


def verl_rows(prompts: list[Prompt], split: str, fmt: PromptFormat) -> pd.DataFrame:
    """``prompts`` as verl's RL dataset rows (``split`` for a generated prompt's ``extra_info``), each prompt the
    conversation ``fmt`` makes of it."""
    return pd.DataFrame({
        "data_source": [p.data_source for p in prompts],
        "prompt": [fmt.messages(p.text) for p in prompts],
        "ability": [ABILITY] * len(prompts),
        "reward_model": [{"ground_truth": p.answer, "style": "rule"} for p in prompts],
        "extra_info": [{"index": i, "split": split, **p.extra_info, PROMPT_KEY: p.text} for i, p in enumerate(prompts)],
    })


def write_data(recipe: Recipe, out_dir: Path, steps: int) -> tuple[Path, Path]:
    """The train file (``steps`` steps of ``prompts_per_step`` prompts) and the validation file (the held-out prompts,
    else a few), in ``out_dir``."""
    from tunekit.trainer.build import load_tokenizer

    workload, fmt = build_workload(recipe.task), prompt_format(recipe.task, load_tokenizer(recipe))
    b, seed = recipe.system.batch, recipe.probe.seed
    out_dir.mkdir(parents=True, exist_ok=True)
    train, val = out_dir / TRAIN, out_dir / VAL
    verl_rows(workload.probe_prompts(b.prompts_per_step, steps, seed), "train", fmt).to_parquet(train, index=False)
    # the held-out prompts (task.eval_fraction or task.eval_dataset), else a few drawn from a seed no probe step uses
    held = workload.eval_prompts(recipe.probe.eval_prompts) or workload.probe_prompts(VAL_ROWS, 1, seed + 1)[:VAL_ROWS]
    verl_rows(held, "val", fmt).to_parquet(val, index=False)
    return train, val


def prompt_texts(files: Iterable[Path]) -> list[str]:
    """The prompt text of every row of the written ``files``."""
    return [info[PROMPT_KEY] for f in files for info in pd.read_parquet(f)["extra_info"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a recipe's workload as verl's train/val parquet files.")
    p.add_argument("recipe", help="the recipe YAML (a search's best-recipe.yaml)")
    p.add_argument("out_dir")
    p.add_argument("--steps", type=int, required=True, help="training steps the train file covers")
    p.add_argument("--model", action="store_true", help="also give verl its checkpoint under OUT_DIR: a copy with the "
                                                         "tokenizer verl's rollout needs (a newline token, a chat "
                                                         "template), or a link to a converted checkpoint")
    args = p.parse_args(argv)
    from tunekit.workload.pretrained import resolve_model

    # a pretrained preset's checkpoint (converted here if the cache lacks it): its tokenizer formats the prompts
    recipe, out = resolve_model(load_recipe(args.recipe)), Path(args.out_dir)
    train, val = write_data(recipe, out, args.steps)
    print(f"wrote {train} and {val}")
    if args.model:
        from tunekit.runners.model_dir import MODEL_COPY, check_prompt_ids, prepare_model

        model, given = prepare_model(recipe, out, gpu=True, chat_rollout=True), out / MODEL_COPY
        check_prompt_ids(recipe, model, prompt_texts([train, val]))
        if model != given:  # the checkpoint as it is: linked where the command finds it
            if given.is_dir() and not given.is_symlink():
                shutil.rmtree(given)
            given.unlink(missing_ok=True)
            given.symlink_to(model.resolve(), target_is_directory=True)
        print(f"wrote {given}" + (f" (a link to {model})" if model != given else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
