"""The ``tunekit`` command: each command declares options and hands off to one library function."""

from __future__ import annotations

import shlex
import signal
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tunekit import metrics
from tunekit.config.errors import ConfigError, TunekitError
from tunekit.config.recipe import ProbeConfig

class _PlainHelp:
    """``--help`` is a flag: its help row shows no value to give."""

    def get_help_option(self, ctx):  # noqa: ANN001, ANN201
        opt = super().get_help_option(ctx)
        if opt is not None:
            opt.metavar = ""
        return opt


class _Command(_PlainHelp, typer.core.TyperCommand):
    """A command whose help shows plain words for what each option takes (an argument: its metavar alone)."""

    def get_params(self, ctx):  # noqa: ANN001, ANN201
        params = super().get_params(ctx)
        for p in params:
            if isinstance(p, typer.core.TyperArgument) and p.metavar:
                p.display_type = lambda _ctx: ""  # its metavar, in the name column, says what it takes
        return params


class _Group(_PlainHelp, typer.core.TyperGroup):
    pass


app = typer.Typer(add_completion=False, no_args_is_help=True, cls=_Group,
                  help="Find the cheapest RL post-training configuration that still learns.")
out = Console()
err = Console(stderr=True, soft_wrap=True)

RecipeOpt = Annotated[Optional[str], typer.Option("--recipe", "-r", metavar="NAME|PATH", help="Recipe name in recipes/ or a YAML path; default: the embedded default.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE", help="Override a recipe key: dotted.key=value (repeatable).")]
RunnerOpt = Annotated[Optional[str], typer.Option("--runner", metavar="NAME", help="What runs the probes: builtin (tunekit's trainer), trl (TRL's GRPOTrainer) or verl (verl's PPO trainer); default: the recipe's runner (same as --set runner=NAME).")]
ProfileOpt = Annotated[Optional[str], typer.Option("--gpu-profile", metavar="NAME|PATH", help="Price profile name or YAML path; default: from the GPU NVML reports.")]
STEPS, SEED = ProbeConfig.model_fields["steps"].default, ProbeConfig.model_fields["seed"].default


STOPPED_EXIT = 3
"""``tunekit search``'s exit code when it stopped at ``--time-limit``: a script runs it again with ``--resume``."""
UNKNOWN = "unknown"  # how every command prints a value nobody knows (None in the records)


def _flag(name: str, help: str):  # noqa: A002
    """A plain on/off switch: ``--name`` alone turns it on, so the help shows no value to give."""
    return typer.Option(name, help=help, metavar="")


def _sets(set_: Optional[list[str]], runner: Optional[str]) -> list[str]:
    """The ``--set`` overrides, with ``--runner NAME`` as one more (``runner=NAME``, checked like any key)."""
    return list(set_ or []) + ([f"runner={runner}"] if runner else [])


def _recipe(recipe: Optional[str], set_: Optional[list[str]], runner: Optional[str] = None, **options: tuple[str, object]):
    """The validated recipe: ``--set`` overrides, then the command's own options (key -> (option, value), None for
    not given), each quoted in an error as the user typed it."""
    from tunekit.config import load_recipe

    given = {key: f"{opt} {value}" for key, (opt, value) in options.items() if value is not None}
    given |= {"runner": f"--runner {runner}"} if runner else {}
    overrides = _sets(set_, runner) + [f"{key}={options[key][1]}" for key in given if key != "runner"]
    return load_recipe(recipe, overrides, typed=given)


def _search_source(path: str, sets: list[str], searched: set[str]) -> str:
    """Where the search section came from, for its errors: the recipe file, and each ``--set`` of a search key or of
    a key the space searches (whose value the baseline takes)."""
    keys = [s.split("=", 1)[0].strip() for s in sets]
    said = [f"--set {s}" for s, k in zip(sets, keys) if k.split(".")[0] == "search" or k in searched]
    return f"{path} with {' '.join(said)}" if said else path


def _probe_command(recipe: Optional[str], sets: list[str]) -> str:
    """The ``tunekit probe`` line that runs this recipe (as the user named it: a shipped name or a file path) with
    these overrides."""
    return shlex.join(["tunekit", "probe", *(["--recipe", recipe] if recipe else []), *[a for s in sets for a in ("--set", s)]])


def _located(e: TunekitError, recipe: Optional[str], sets: list[str]) -> TunekitError:
    """``e`` with the recipe file named first where its sentence opens with a key that file sets and no ``--set``
    does (a dataset, a reward, a model path checked after the recipe loaded); otherwise ``e``."""
    from tunekit.config.load import list_keys, load_raw

    key = e.message.split(" ", 1)[0].rstrip(":")
    if not recipe or not Path(recipe).is_file() or key not in list_keys() or any(
            s.split("=", 1)[0].strip() == key for s in sets):
        return e
    node = load_raw(recipe)[0]
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return e
        node = node[part]
    return type(e)(f"{recipe}: {e.message}")


def _fail(e: TunekitError) -> None:
    err.print(f"[red]error:[/red] {escape(e.message)}", highlight=False)
    raise typer.Exit(e.exit_code)


@app.command(cls=_Command)
def probe(
    recipe: RecipeOpt = None,
    steps: Annotated[Optional[int], typer.Option(metavar="INTEGER", help=f"Training steps (default: the recipe's probe.steps, {STEPS} unless the recipe sets it).")] = None,
    seed: Annotated[Optional[int], typer.Option(metavar="INTEGER", help=f"Random seed (default: the recipe's probe.seed, {SEED} unless the recipe sets it).")] = None,
    out_dir: Annotated[Optional[str], typer.Option("--out", metavar="DIR", help="Runs directory (default runs/).")] = None,
    gpu_profile: ProfileOpt = None,
    runner: RunnerOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run one short training probe and record its cost and reward."""
    try:
        r = _recipe(recipe, set_, runner, **{"probe.steps": ("--steps", steps), "probe.seed": ("--seed", seed)})
        _check_profile(gpu_profile)
        _check_out_dir(out_dir or r.probe.out, "--out" if out_dir else "probe.out")
        from tunekit.launch.probe import check_probe, fit_warning, launch_probe  # the trainer: after the arguments are checked

        plan = check_probe(r, gpu_profile=gpu_profile)  # before the progress bar: bad input is one red line
        if (warning := fit_warning(plan)) is not None:
            err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
        with Progress(TextColumn("[bold]probe[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=err, transient=False, disable=not err.is_terminal) as bar:
            task = bar.add_task(r.name, total=r.probe.steps)
            result = launch_probe(plan, out=out_dir, progress=lambda n: bar.update(task, completed=n))
    except TunekitError as e:
        _fail(_located(e, recipe, _sets(set_, runner)))
    _print_summary(result.summary, result.run_dir)
    _print_samples(result.run_dir)
    if result.status != "ok":
        raise typer.Exit(1)


def _check_out_dir(out_dir: Optional[str], key: str = "--out") -> None:
    """An output folder (``key``: the option or recipe key that named it) that names or lies under a file, or under a
    folder that takes no new entry, is refused before anything is written (a missing folder is made)."""
    if out_dir is None:
        return
    path = Path(out_dir)
    while not path.exists() and path != path.parent:
        path = path.parent
    if not path.is_dir():
        raise ConfigError(f"{key} {out_dir}: {path} is a file, not a folder; give a folder (made if it does not exist).")
    try:  # root may write anywhere the permission bits say, yet not where the file system refuses (/proc)
        with tempfile.TemporaryDirectory(dir=path):
            pass
    except OSError as e:
        raise ConfigError(f"{key} {out_dir}: {path} takes no new folder ({e.strerror or e}); give a writable folder.") from None


def _check_study(study: Optional[str]) -> None:
    """A --study that is empty or holds a path separator is refused: the name is also a folder under --out's default."""
    if study is not None and (not study.strip() or "/" in study or "\\" in study or study in (".", "..")):
        raise ConfigError(f"--study {study!r}: give a plain name (letters, digits, - or _), not empty and with no path "
                          "in it: it also names the search's folder.")


def _check_profile(gpu_profile: Optional[str]) -> None:
    """A --gpu-profile that names no profile is refused before anything heavy is imported."""
    if gpu_profile is not None:
        from tunekit.estimate.profiles import load_profile

        load_profile(gpu_profile)


def _fmt(v) -> str:
    if v is None:
        return UNKNOWN
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _print_summary(s: dict, run_dir: Path) -> None:
    t = Table(title=f"probe {run_dir.name}", show_header=False)
    t.add_column("what", no_wrap=True)
    t.add_column("value", overflow="fold")  # a long reason or cache path wraps whole, never cut short
    keys = ["status", "reason", "runner", metrics.RUNNER_VERSION, "steps", "wall_s", "startup_s", "startup/launch_s",
            "startup/prepare_s", "startup/imports_s", "startup/ray_start_s", "startup/setup_s",
            "startup/framework_init_s", "startup/model_load_s",
            "startup/workers_start_s", "startup/reward_workers_s", "startup/engine_start_s",
            "startup/weight_sync_setup_s", "startup/before_first_step_s", "startup/eval_before_s", "startup/other_s", "first_step/step_s", "first_step/excess_s",
            "first_step/compile_s", "first_step/graph_capture_s", "compile/dynamo_s", "compile/backend_s", "compile/graphs",
            "compile/graph_captures", "compile_cache/inductor", "compile_cache/vllm",
            "compile_cache/dir", "reward_first10", "reward_last10", metrics.EVAL_REWARD_BEFORE, "eval/reward_first", "eval/reward_last",
            "eval/evaluations", metrics.THROUGHPUT, "profile",
            "resolved/fsdp", "resolved/compile", "resolved/master_weights", "resolved/cuda_graphs",
            "cost/probe_yuan", "cost/projected_yuan", "cost/target_steps", "cost/run_rule"]
    steady, planned = s.get("steady", {}), s.get("steps_planned")
    for k in keys:
        if s.get(k) not in (None, ""):
            cut = k == "steps" and isinstance(planned, int) and s[k] < planned
            t.add_row(k, f"{s[k]} of {planned}" if cut else _fmt(s[k]))
    if s.get("cost/extrapolated_from_warmup"):
        t.add_row("projection", "from warm-up steps only (no step ran past probe.warmup_steps): read it as pessimistic")
    for k in sorted(steady):
        if k.startswith("timing_s/") or k == metrics.MAX_RESERVED_GB:
            t.add_row(f"median {k}", _fmt(steady[k]))
    from tunekit.estimate.memory import headroom_lines, kv_verdict

    for gpu, line in headroom_lines(s):
        t.add_row(f"memory headroom GPU {gpu}", line)
    if (kv := kv_verdict(s)) is not None:
        t.add_row("rollout KV cache", kv)
    out.print(t)
    out.print(f"run dir: {run_dir}", highlight=False, soft_wrap=True)  # one line to copy, however narrow the terminal


def _print_samples(run_dir: Path, n: int = 2) -> None:
    """``n`` of the last kept step's samples (samples.parquet) and, with evaluation on, ``n`` answers of the last
    evaluation (eval_samples.parquet): what the model said, beside its reward."""
    from tunekit.rundir import EVAL_SAMPLES, SAMPLES, read_samples

    for name, key, title in ((SAMPLES, "step", "samples of step {} (the last kept; steps count from 0)"),
                             (EVAL_SAMPLES, "trained_steps", "held-out answers after {} steps")):
        samples = read_samples(run_dir, name)
        if samples.empty:
            continue
        last = int(samples[key].max())
        t = Table("prompt", "response", "answer", "reward", title=title.format(last))
        for row in samples[samples[key] == last].head(n).itertuples():
            t.add_row(escape(row.prompt), escape(row.response), escape(str(row.answer)), _fmt(float(row.reward)))
        out.print(t)


@app.command(cls=_Command)
def recipes(keys: Annotated[bool, _flag("--keys", help="List every recipe key instead.")] = False) -> None:
    """List the recipes that ship (or every key a recipe or --set may use)."""
    from tunekit.config import RECIPES_DIR, list_keys, load_recipe

    if keys:
        for k in list_keys():
            out.print(k, highlight=False)
        return
    rows = []
    try:
        for p in sorted(RECIPES_DIR.glob("*.yaml")):
            r = load_recipe(str(p))
            rows.append((p.stem, r.algorithm.name, r.model.preset or r.model.path or "embedded tiny",
                         r.system.rollout.backend, r.system.controller, r.description))
    except TunekitError as e:
        _fail(e)
    _listing(("name", "algorithm", "model", "backend", "controller", "description"), rows)


@app.command(cls=_Command)
def profiles() -> None:
    """List the hardware price profiles that ship."""
    from tunekit.estimate.profiles import list_profiles

    rows = [(p.name, p.nvml_pattern or "- (matches no GPU)", _fmt(p.memory_gib), _fmt(p.peak_bf16_tflops),
             _fmt(p.yuan_per_gpu_hour), _fmt(p.price_date), p.price_source) for p in list_profiles()]
    _listing(("name", "GPU pattern", "memory GiB", "peak bf16 TFLOP/s", "yuan/GPU-h", "price as of", "price source"), rows)


def _listing(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """Rows whose last field is a sentence: a table where the terminal is wide enough for it, else each row as its
    name and its other fields, named, on one line and its sentence wrapped beneath it (a narrow table would fold the
    sentence a word a line and cut the names)."""
    from tunekit.estimate.costmodel.view import natural_width

    if natural_width(table := _table(header, rows), out) <= out.width:
        out.print(table)
        return
    for row in rows:
        facts = " · ".join(f"{h} {v}" for h, v in zip(header[1:-1], row[1:-1]))
        out.print(f"[bold]{escape(row[0])}[/bold]  {escape(facts)}", highlight=False)
        out.print(Padding(escape(row[-1]), (0, 0, 1, 2)), highlight=False)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
    t = Table(*header)
    for row in rows:
        t.add_row(*row)
    return t


@app.command(cls=_Command)
def search(
    budget_yuan: Annotated[float, typer.Option("--budget-yuan", metavar="YUAN", help="Most yuan the study's probes may spend in all (a resumed study counts what it spent).")],
    recipe: Annotated[Optional[str], typer.Option("--recipe", "-r", metavar="NAME|PATH", help="Recipe with a search: section; default: tiny-ppo (the embedded default and its space).")] = None,
    trials: Annotated[int, typer.Option(metavar="INTEGER", help="Probed trials the study should have (a repeated configuration does not count; a resumed study counts its earlier ones); a confirmation round follows.")] = 12,
    storage: Annotated[Optional[str], typer.Option(metavar="URL", help="Optuna storage URL, e.g. postgresql://user:pw@host/db; default: sqlite in --out.")] = None,
    study: Annotated[Optional[str], typer.Option("--study", metavar="NAME", help="Study name (default: the recipe's name).")] = None,
    resume: Annotated[bool, _flag("--resume", help="Join the existing study (after a stop, or as another worker).")] = False,
    out_dir: Annotated[Optional[str], typer.Option("--out", metavar="DIR", help="Output directory: study.db, search.json, runs/ (default search-out/<study>).")] = None,
    time_limit: Annotated[Optional[float], typer.Option("--time-limit", metavar="SECONDS", help=f"Start no probe (trial or confirmation) expected to end later than this many seconds after the search starts (expected: the study's longest probe so far, else probe.timeout_s); stop there with exit code {STOPPED_EXIT}, search.json saying how to continue (--resume repeats no finished probe).")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", metavar="INTEGER", help="Seed of the sampler (Optuna's TPE): the same recipe, seed and study propose the same configurations in the same order (default: unseeded; give each worker of one study its own).")] = None,
    gpu_profile: ProfileOpt = None,
    runner: RunnerOpt = None,
    set_: SetOpt = None,
) -> None:
    """Search for the cheapest configuration whose reward still reaches the recipe's threshold.

    Exit codes: 0 an answer; 1 no configuration reaches the threshold; 2 bad input; 3 stopped at --time-limit
    (continue with --resume); 130 interrupted (Ctrl-C or SIGTERM: the running probe is probed again on --resume)."""
    from tunekit.config import recipe_path
    from tunekit.search.checks import check_arguments

    ref = recipe or "tiny-ppo"
    sets = _sets(set_, runner)
    try:
        r = _recipe(ref, set_, runner)
        source = _search_source(str(recipe_path(ref)), list(set_ or []), {p.key for p in r.search.space})
        check_arguments(r, budget_yuan, trials, source)
        if runner and any(p.key == "runner" for p in r.search.space):
            raise ConfigError(f"--runner {runner}: {source}'s search.space searches the runner itself; drop --runner "
                              "to search it, or the runner entry of search.space to keep every probe on one.")
        _check_profile(gpu_profile)
        _check_out_dir(out_dir)
        _check_study(study)
        from tunekit.search import run_search  # the trainer: after the arguments are checked
        from tunekit.search.view import SearchProgress, print_search

        from tunekit.search.deadline import never_fits, stopped

        if time_limit is not None and not time_limit > 0:
            raise ConfigError(f"--time-limit {time_limit:g}: give a positive number of seconds, e.g. --time-limit 540.")
        name = study or r.name
        # SIGTERM (an outer `timeout`) stops the search as Ctrl-C does: the running probe is ended and retried on --resume
        term = signal.signal(signal.SIGTERM, signal.default_int_handler)
        try:
            with SearchProgress(err, trials) as view:
                result = run_search(r, budget_yuan=budget_yuan, trials=trials, storage=storage, resume=resume,
                                    out_dir=Path(out_dir or Path("search-out") / name), gpu_profile=gpu_profile,
                                    progress_cb=view, study_name=name, recipe_ref=ref, base_overrides=sets,
                                    source=source, time_limit_s=time_limit, seed=seed)
        finally:
            signal.signal(signal.SIGTERM, term)
    except TunekitError as e:
        _fail(_located(e, recipe, sets))
    print_search(out, result)
    _search_report(Path(out_dir or Path("search-out") / name))
    if never_fits(result.stop_reason):  # the same command would stop here again: bad input, not a part
        _fail(ConfigError(f"--time-limit {time_limit:g}: {result.stop_reason.split(': ', 1)[1]}"))
    if stopped(result.stop_reason):
        raise typer.Exit(STOPPED_EXIT)
    if result.stop_reason.startswith("interrupted"):
        raise typer.Exit(130)
    if result.best is None:
        raise typer.Exit(1)


def _search_report(search_dir: Path) -> None:
    """Every search ends with its report; a report that can't be built never fails the search."""
    from tunekit.report import build_report

    try:
        path = build_report([search_dir], search_dir / "report.html")
        out.print(f"report: {path}", highlight=False)
    except TunekitError as e:
        err.print(f"[yellow]no report:[/yellow] {e.message}", highlight=False)


@app.command(cls=_Command)
def estimate(
    recipe: RecipeOpt = None,
    runs: Annotated[Optional[list[str]], typer.Option("--runs", metavar="DIR", help="Directory holding earlier probes, searched recursively (repeatable; default runs/). With --gpu-profile they also calibrate the cost model, whatever their configuration.")] = None,
    gpu_profile: Annotated[Optional[str], typer.Option(metavar="NAME|PATH", help="Estimate the run on this GPU type with the cost model (per phase, memory, yuan), and reprice the probes of this exact configuration with it (default: this machine's GPU for a cuda recipe, reprice only).")] = None,
    compare_profiles: Annotated[Optional[str], typer.Option("--compare-profiles", metavar="NAMES", help="Comma-separated profiles, e.g. a100-80g,h100-80g,h200: rank these GPU types by the full run's yuan.")] = None,
    target_steps: Annotated[Optional[int], typer.Option(metavar="INTEGER", help="Steps of the full run (default: the recipe's run length, run.*).")] = None,
    sample_responses: Annotated[Optional[int], typer.Option("--sample-responses", metavar="PROMPTS", help="With --gpu-profile or --compare-profiles: before any probe of this workload, sample the initial policy's responses to the first PROMPTS of the first step's prompts (each samples_per_prompt times; Hugging Face generate on this machine's GPU, else its CPU) and charge their mean length instead of the task.max_new_tokens budget. Probes of the workload under --runs take precedence.")] = None,
    runner: RunnerOpt = None,
    set_: SetOpt = None,
) -> None:
    """Estimate a recipe's peak memory per GPU and role and its full-run cost without running anything: on a GPU type from the cost model (--gpu-profile, --compare-profiles), and from earlier probes of the same configuration."""
    from tunekit.estimate.costmodel.view import print_comparison, print_prediction
    from tunekit.estimate.views import check_model, estimate as project, model_estimates
    from tunekit.runners import runner_for
    from tunekit.placement.dist import on_gpu
    from tunekit.launch.probe import pick_profile
    from tunekit.estimate.memory import estimate_memory, model_shape
    from tunekit.estimate.profiles import load_profile
    from tunekit.search.view import print_estimate, print_memory

    from tunekit.workload.pretrained import resolve_model

    try:
        if target_steps is not None and target_steps < 1:
            raise ConfigError(f"--target-steps {target_steps}: a full run has at least one step; give a positive count.")
        if compare_profiles is not None and not [n for n in compare_profiles.split(",") if n.strip()]:
            raise ConfigError("--compare-profiles names no profile; give at least one, e.g. a100-80g,h100-80g "
                              "(`tunekit profiles` lists them).")
        r = resolve_model(_recipe(recipe, set_, runner))  # probes record a converted model by its path

        # where the estimate prices the run: a profile's device, else (repricing probes) where they ran, a GPU
        # unless the recipe asks for the CPU
        priced_on_gpu = (load_profile(gpu_profile).is_gpu if gpu_profile else
                         compare_profiles is not None or r.system.device != "cpu")
        if (why := runner_for(r).refusal(r, gpu=priced_on_gpu)) is not None:
            raise ConfigError(f"{why} (tunekit estimate prices only what runner {r.runner} runs)")
        if runs:
            from tunekit.estimate.views import check_dirs

            check_dirs([Path(d) for d in runs])  # before anything is printed
        if sample_responses is not None and gpu_profile is None and compare_profiles is None:
            raise ConfigError("--sample-responses: the sampled length feeds the cost model; give --gpu-profile NAME "
                              "or --compare-profiles NAMES with it.")
        if gpu_profile is None and compare_profiles is None:  # reprice the probes of this configuration
            if not runs and not Path("runs").is_dir():
                raise ConfigError("no runs/ here to reprice: run `tunekit probe` first (its runs go to runs/), give "
                                  "--runs DIR, or give --gpu-profile NAME for the cost model's estimate without a probe.")
            if on_gpu(r.system.device):
                profile = pick_profile(None, True)
                print_memory(out, estimate_memory(r, model_shape(r), profile.memory_gib if profile else None,
                                                  traits=runner_for(r).traits), profile.name if profile else None)
            else:
                out.print(f"no GPU memory to estimate: the recipe runs on this machine's CPU (system.device "
                          f"{r.system.device}); give --gpu-profile NAME (`tunekit profiles` lists them) for a GPU type.",
                          highlight=False, soft_wrap=True)
            print_estimate(out, project(r, runs_dir=list(runs or ["runs"]), target_steps=target_steps,
                                        probe_command=_probe_command(recipe, _sets(set_, runner))))
            return
        names = [n.strip() for n in (compare_profiles or "").split(",") if n.strip()]
        names += [gpu_profile] if gpu_profile and gpu_profile not in names else []
        profiles = [load_profile(n) for n in names]
        seen: dict[str, str] = {}
        for n, p in zip(names, profiles):
            if p.name in seen:
                raise ConfigError(f"--compare-profiles: {seen[p.name]} and {n} are both named {p.name!r}; give each "
                                  "profile its own name (its name key), so the rows can be told apart.")
            seen[p.name] = n
        check_model(r, profiles)
        sampled = _sampled_length(r, sample_responses)
        if len(profiles) == 1:
            print_memory(out, estimate_memory(r, model_shape(r), profiles[0].memory_gib, traits=runner_for(r).traits),
                         profiles[0].name)
        dirs = list(runs) if runs else (["runs"] if Path("runs").is_dir() else [])
        preds = model_estimates(r, profiles, dirs, target_steps, runners=runner_for, sampled=sampled)
        if len(preds) == 1:
            print_prediction(out, preds[0])
        else:
            print_comparison(out, preds)
        if gpu_profile and dirs:
            try:
                print_estimate(out, project(r, runs_dir=dirs, gpu_profile=gpu_profile, target_steps=target_steps,
                                            probe_command=_probe_command(recipe, _sets(set_, runner))))
            except TunekitError as e:
                out.print(f"no reprice: {e.message}", highlight=False, soft_wrap=True)
    except TunekitError as e:
        _fail(e)


def _sampled_length(recipe, prompts: int | None):
    """The initial policy's response length for ``tunekit estimate --sample-responses`` (None without the option, or
    where every response holds the budget), said as it is found."""
    from tunekit.estimate.costmodel.calibrate import ResponseLength
    from tunekit.trainer.initial_responses import sample_responses

    if prompts is None:
        return None
    if recipe.task.fixed_length:
        out.print("--sample-responses: nothing to sample, every response holds the budget (task.fixed_length)",
                  highlight=False)
        return None
    s = sample_responses(recipe, prompts)
    out.print(f"sampled {s.responses} responses of the initial policy on {s.device} in {s.seconds:.1f} s: "
              f"{s.tokens:.3g} tokens on average of the {recipe.task.max_new_tokens}-token budget", highlight=False)
    return ResponseLength(s.tokens, s.source)


@app.command(cls=_Command)
def loadtest(
    recipe: RecipeOpt = None,
    url: Annotated[Optional[str], typer.Option("--url", metavar="URL", help="An OpenAI-compatible server to load, e.g. http://host:8000 (its API key from the environment variable loadtest.api_key_env names); default: the recipe's own rollout server, which tunekit starts with its engine knobs and stops.")] = None,
    concurrency: Annotated[Optional[str], typer.Option("--concurrency", metavar="N,N,...", help="Requests in flight at each level, e.g. 1,8,32,64 (default: loadtest.concurrency).")] = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", metavar="TEXT", help="Send this text, through the recipe's chat template, as every prompt (default: the recipe's workload).")] = None,
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", metavar="N", help="New tokens per request (default: loadtest.max_tokens, else the recipe's task.max_new_tokens).")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", metavar="T", help="Sampling temperature (default: loadtest.temperature, else the recipe's task.temperature).")] = None,
    max_latency_ms: Annotated[Optional[float], typer.Option("--max-latency-ms", metavar="MS", help="Pass line: the most median single-request latency (default: loadtest.max_latency_ms).")] = None,
    min_qps: Annotated[Optional[float], typer.Option("--min-qps", metavar="QPS", help="Pass line: the fewest requests per second at --at-concurrency (default: loadtest.min_qps).")] = None,
    at_concurrency: Annotated[Optional[int], typer.Option("--at-concurrency", metavar="N", help="Where the QPS pass line is read (default: loadtest.at_concurrency).")] = None,
    out_dir: Annotated[Optional[str], typer.Option("--out", metavar="DIR", help="Directory for loadtest.json (default: runs/<id>).")] = None,
    set_: SetOpt = None,
) -> None:
    """Load-test the rollout engine: latency, QPS and tokens/s at rising concurrency; exit 0 when the pass line
    holds, 1 when not, 2 on bad input (nothing written)."""
    from tunekit import rundir
    from tunekit.config import load_recipe
    from tunekit.loadtest import run_loadtest
    from tunekit.loadtest.view import level_line, print_loadtest

    flags = {"url": url, "concurrency": f"[{concurrency}]" if concurrency is not None else None, "max_tokens": max_tokens,
             "temperature": temperature, "max_latency_ms": max_latency_ms, "min_qps": min_qps,
             "at_concurrency": at_concurrency}
    overrides = list(set_ or []) + [f"loadtest.{k}={v}" for k, v in flags.items() if v is not None]
    typed = {f"loadtest.{k}": f"--{k.replace('_', '-')} {concurrency if k == 'concurrency' else v}"
             for k, v in flags.items() if v is not None}  # an error quotes the option the user typed
    try:
        r = load_recipe(recipe, overrides, typed=typed)
        _check_out_dir(out_dir)
        where = Path(out_dir) if out_dir else Path("runs") / rundir.new_run_id(f"loadtest-{r.name}")
        test = run_loadtest(r, out_dir=where, prompt=prompt,
                            progress=lambda row: err.print(escape(level_line(row)), highlight=False, soft_wrap=True))
    except TunekitError as e:
        _fail(e)
    print_loadtest(out, test, where / rundir.LOADTEST)
    if not test.passed:
        raise typer.Exit(1)


@app.command(cls=_Command)
def report(
    paths: Annotated[Optional[list[Path]], typer.Argument(metavar="PATH", help="Runs directories, search output directories or run directories (default: every search under search-out/, else runs/).")] = None,
    output: Annotated[str, typer.Option("--output", "-o", metavar="FILE", help="HTML file to write (its folder is created if needed).")] = "reports/report.html",
    storage: Annotated[Optional[str], typer.Option(metavar="URL", help="Optuna storage URL of a search, e.g. sqlite:///search-out/study.db.")] = None,
    study: Annotated[Optional[str], typer.Option(metavar="NAME", help="Study name in --storage (default: its only study).")] = None,
) -> None:
    """Write one offline HTML report comparing probes, with a search's history when there is one."""
    from tunekit.report import build_report

    try:
        path = build_report(list(paths or []) or ([] if storage else _default_report_paths()), output, storage=storage, study=study)
    except TunekitError as e:
        _fail(e)
    out.print(f"report: {path}", highlight=False, soft_wrap=True)


def _default_report_paths() -> list[Path]:
    """With no PATH: the searches under search-out/ (each with its own probes) when there are any, else runs/."""
    searches = sorted(Path("search-out").glob("*/search.json"))
    runs = Path(ProbeConfig.model_fields["out"].default)
    return [p.parent for p in searches] or ([runs] if runs.is_dir() else [])


def main() -> None:
    try:
        app()
    except TunekitError as e:  # a library error raised outside a command's own handler
        err.print(f"[red]error:[/red] {escape(e.message)}", highlight=False)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
