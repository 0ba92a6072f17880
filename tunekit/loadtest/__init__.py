"""``tunekit loadtest``: the rollout engine's latency and QPS at rising concurrency, and a pass line.

A load test measures each concurrency level of ``loadtest.levels`` in rising order (warm-up requests first, not
counted), through vLLM's own benchmark client where it fits (:mod:`tunekit.loadtest.bench`) or tunekit's async HTTP
client (:mod:`tunekit.loadtest.client`), and writes ``loadtest.json`` after every level (:mod:`.results`): a test
that stops early (every request of a level failed, the server died, an interrupt) keeps the rows it measured and
says why it stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunekit import rundir
from tunekit.config import Recipe
from tunekit.config.errors import ConfigError
from tunekit.loadtest import bench
from tunekit.loadtest.client import Sampling, run_level
from tunekit.loadtest.prompts import prompt_texts
from tunekit.loadtest.results import Loadtest, level_row
from tunekit.loadtest.target import Target, open_target, preflight, recipe_tokenizer

__all__ = ["Loadtest", "pick_client", "run_loadtest", "sampling_of"]


def sampling_of(recipe: Recipe) -> Sampling:
    """What every request asks for: ``loadtest.max_tokens`` and ``temperature``, else the recipe's task's."""
    c, t = recipe.loadtest, recipe.task
    return Sampling(max_tokens=c.max_tokens or t.max_new_tokens,
                    temperature=t.temperature if c.temperature is None else c.temperature,
                    ignore_eos=c.ignore_eos, stream=c.stream)


def pick_client(recipe: Recipe) -> str:
    """``vllm_bench`` or ``http`` for ``loadtest.client`` (``auto``: vLLM's client where it can run and the responses
    stream, as it always streams them); a ConfigError for a client that cannot run here."""
    c = recipe.loadtest
    if c.client == "vllm_bench":
        if not bench.available():
            raise ConfigError(f"loadtest.client vllm_bench needs {' and '.join(bench.BENCH_NEEDS)} installed here; "
                              "install them or set loadtest.client to http or auto.")
        if not c.stream:
            raise ConfigError("loadtest.client vllm_bench always streams, so loadtest.stream false cannot apply; set "
                              "loadtest.stream to true or loadtest.client to http.")
        return "vllm_bench"
    if c.client == "auto" and c.stream and bench.available():
        return "vllm_bench"
    return "http"


Progress = Callable[[dict[str, Any]], None]


def _measure(target: Target, client: str, recipe: Recipe, prompts: list[str], dataset: Path | None, level: int,
             out_dir: Path) -> dict[str, Any]:
    """One level's row, from the client that sends the requests."""
    c, sampling = recipe.loadtest, sampling_of(recipe)
    if client == "vllm_bench":
        return bench.run_bench_level(target.endpoint, sampling, dataset=dataset,
                                     tokenizer=target.tokenizer or recipe_tokenizer(recipe), concurrency=level,
                                     requests=c.requests_at(level), warmup=c.warmup_requests, out_dir=out_dir,
                                     seed=recipe.probe.seed, timeout_s=c.timeout_s)
    outcomes, duration = run_level(target.endpoint, sampling, prompts, concurrency=level,
                                   requests=c.requests_at(level), warmup=c.warmup_requests, timeout_s=c.timeout_s)
    return level_row(level, outcomes, duration)


def _sweep(test: Loadtest, target: Target, client: str, recipe: Recipe, prompts: list[str], out_dir: Path,
           progress: Progress | None) -> None:
    """Every level in rising order, the record rewritten after each; stops when the server died or every request
    of a level failed (``test.stopped`` says which)."""
    dataset = bench.write_dataset(out_dir / rundir.LOADTEST_PROMPTS, prompts) if client == "vllm_bench" else None
    for level in recipe.loadtest.levels:
        row = _measure(target, client, recipe, prompts, dataset, level, out_dir)
        test.add(row)
        rundir.write_loadtest(out_dir, test.record())
        if progress is not None:
            progress(row)
        if (died := target.problem()) is not None:
            test.stopped = died
        elif row["failed"] == row["requests"]:
            test.stopped = f"every request at concurrency {level} failed ({row['error']})"
        if test.stopped:
            return


def run_loadtest(recipe: Recipe, *, out_dir: Path, prompt: str | None = None,
                 progress: Progress | None = None) -> Loadtest:
    """Load-test the target level by level into ``out_dir``/loadtest.json (kept, with why, when the test stops
    early). Bad input raises a TunekitError and leaves ``out_dir`` as it was."""
    from tunekit.workload.pretrained import resolve_model

    client = pick_client(recipe)
    served = preflight(recipe)  # before a model is converted for nothing
    recipe = resolve_model(recipe)  # a pretrained preset or a .gguf file: its converted checkpoint
    prompts = prompt_texts(recipe, text=prompt)
    sampling = sampling_of(recipe)
    out_dir = Path(out_dir)
    made = [p for p in (out_dir, *out_dir.parents) if not p.exists()]  # the folders this call makes, deepest first
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open_target(recipe, out_dir=out_dir, max_tokens=sampling.max_tokens, model=served) as target:
            test = Loadtest(config=recipe.loadtest, target=target.describe(client),
                            sampling={**vars(sampling), "prompts": len(prompts), "recipe": recipe.name})
            try:
                _sweep(test, target, client, recipe, prompts, out_dir, progress)
            except KeyboardInterrupt:
                test.stopped = "interrupted"
                raise
            finally:
                rundir.write_loadtest(out_dir, test.record())
    except BaseException:
        _drop_if_empty(made)
        raise
    return test


def _drop_if_empty(made: list[Path]) -> None:
    """Bad input found once the target was asked (a URL that does not answer) leaves nothing behind: the folders
    the test made (deepest first), each while it is empty."""
    for folder in made:
        try:
            folder.rmdir()
        except OSError:
            return
