"""``system.compile``: torch.compile of the model (whole, or per block under FSDP2) and the fused logprob change
speed, never what is learned."""

from __future__ import annotations

import pytest
import torch

from tunekit.config import AlgorithmConfig, MemoryConfig, load_recipe
from tunekit.workload.models import build_causal_lm, build_config
from tunekit.runners import runner_for
from tunekit.rundir import COMPILE_CACHE
from tunekit.trainer.build import build_actor, build_critic, build_ref
from tunekit.placement.dist import Dist
from tunekit.trainer.parallel import decoder_layers
from tunekit.trainer.roles.actor import Actor


def _lm(layers: int = 1):
    """The embedded model's architecture with ``layers`` decoder blocks, random weights (seeded). One block compiles
    as every other does, and Inductor's time on CPU grows with the blocks a graph holds: the tests that compile a
    whole model compile one block."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(build_config("tiny-arith", num_hidden_layers=layers), dtype=torch.float32)


def _actor(compile: bool) -> Actor:
    return Actor(_lm(), algo=AlgorithmConfig(), mem=MemoryConfig(), dist=Dist(), micro_batch=4, temperature=0.7,
                 compile=compile)


def _batch(seed: int, prompt: int, response: int, vocab: int, rows: int = 8) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    mask[:2, :2] = 0  # left-padded prompts
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": torch.ones(rows, response, dtype=torch.long), "advantages": torch.randn(rows, response, generator=g)}


@pytest.mark.slow
def test_compiled_actor_updates_like_the_eager_one_across_shapes() -> None:
    eager, compiled = _actor(False), _actor(True)
    # a plain module (one rank, here on CPU) is compiled whole: one graph a pass, its blocks left as they are
    assert hasattr(compiled.model.forward, "_torchdynamo_orig_callable")
    assert all(not hasattr(b.forward, "_torchdynamo_orig_callable") for b in decoder_layers(compiled.model))
    assert list(compiled.model.state_dict()) == list(eager.model.state_dict())  # weight sync finds the same names
    # sequence lengths change between steps, as prompts and responses do in a probe (dynamo recompiles once, when the
    # response width and so ``logits_to_keep`` change); the first step's micro-batches (4 rows, 4 response tokens)
    # are those of the first step in the test of traces, which loads these graphs from Inductor's cache
    mb = _updates_alike(eager, compiled, [(5, 4), (7, 4), (9, 8)], loss_abs=1e-5, norm_rel=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(compiled.logprobs(mb), eager.logprobs(mb), atol=1e-4, rtol=1e-4)


def _updates_alike(reference: Actor, other: Actor, shapes: list[tuple[int, int]], *, loss_abs: float,
                   norm_rel: float) -> dict[str, torch.Tensor]:
    """Both actors update on the same batch of each (prompt, response) width in turn; each step's loss and gradient
    norm agree. Returns the last batch."""
    vocab = reference.model.config.vocab_size
    for step, (prompt, response) in enumerate(shapes):
        mb = _batch(step, prompt, response, vocab)
        a = reference.update(mb, mini_batch=8, seed=step)
        b = other.update(mb, mini_batch=8, seed=step)
        assert b["actor/pg_loss"] == pytest.approx(a["actor/pg_loss"], abs=loss_abs), step
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=norm_rel), step
    return mb


def test_the_recipe_key_reaches_the_roles() -> None:
    recipe = load_recipe(None, ["system.compile=true", "system.device=cpu"])
    lm = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)
    actor = build_actor(recipe, Dist(), lm)
    assert actor.compiled
    assert hasattr(actor.model.forward, "_torchdynamo_orig_callable")
    fresh = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)
    assert not build_actor(load_recipe(None, ["system.device=cpu"]), Dist(), fresh).compiled


@pytest.mark.slow
def test_compiled_critic_and_checkpointed_actor_update_like_the_eager_ones() -> None:
    from tunekit.workload.models import CriticModel
    from tunekit.trainer.roles.critic import Critic

    def critic(compile: bool) -> Critic:
        model = CriticModel.from_actor(_lm())
        return Critic(model, algo=AlgorithmConfig(), mem=MemoryConfig(), dist=Dist(), micro_batch=4, compile=compile)

    def checkpointed_actor(compile: bool) -> Actor:
        return Actor(_lm(), algo=AlgorithmConfig(), mem=MemoryConfig(gradient_checkpointing=True), dist=Dist(),
                     micro_batch=4, temperature=0.7, compile=compile)

    pairs = [(critic(False), critic(True)), (checkpointed_actor(False), checkpointed_actor(True))]
    vocab = pairs[1][0].model.config.vocab_size
    for step, (prompt, response) in enumerate([(5, 6), (7, 8)]):
        mb = _batch(step, prompt, response, vocab)
        mb |= {"old_values": torch.zeros(8, response), "returns": torch.randn(8, response, generator=torch.Generator().manual_seed(step))}
        for eager, compiled in pairs:
            a, b = eager.update(mb, mini_batch=8, seed=step), compiled.update(mb, mini_batch=8, seed=step)
            assert b.keys() == a.keys()
            for key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (type(eager).__name__, step, key)


def test_probes_writing_to_one_directory_share_inductors_caches(tmp_path, monkeypatch) -> None:
    # importing Inductor sets its default directory in this process's environment: the probes' still wins
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "default"))
    monkeypatch.delenv("TORCHINDUCTOR_FX_GRAPH_CACHE", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")  # a switch the user turned off stays off
    runs = tmp_path / "search" / "runs"
    recipe = load_recipe(None, ["system.compile=true"])
    first, second = (runner_for(recipe).env(recipe, runs / name, on_gpu=False) for name in ("P00", "P01"))
    assert first["TORCHINDUCTOR_CACHE_DIR"] == second["TORCHINDUCTOR_CACHE_DIR"] == str(runs.resolve() / COMPILE_CACHE)
    assert first["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1" and first["TORCHINDUCTOR_AUTOGRAD_CACHE"] == "0"
    # a probe that compiles nothing leaves the directory alone (importing Inductor would create the cache there)
    plain = load_recipe(None)
    assert runner_for(plain).env(plain, runs / "P02", on_gpu=False)["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "default")


def test_hf_generate_on_a_compiled_actor_decodes_eagerly_and_leaves_the_forward_compiled() -> None:
    from torch._dynamo.utils import counters

    from tunekit.trainer.rollout.hf import HFRollout

    actor = _actor(True)
    compiled = actor.model.forward
    rollout = HFRollout(model=actor.model, device=torch.device("cpu"), pad_id=0, eos_id=1, max_new_tokens=3,
                        temperature=1.0, fixed_length=True, shares_actor=True)
    vocab = actor.model.config.vocab_size
    prompts = {"prompt_ids": torch.randint(2, vocab, (2, 4), generator=torch.Generator().manual_seed(0)),
               "prompt_mask": torch.ones(2, 4, dtype=torch.long)}
    frames = counters["stats"]["unique_graphs"]
    ids, logp = rollout.generate(prompts, seed=0)
    assert ids.shape == logp.shape == (2, 3)
    assert counters["stats"]["unique_graphs"] == frames  # nothing traced while decoding
    assert actor.model.forward is compiled


def _graphs_per_step(run, widths: list[int]) -> list[int]:
    """Dynamo's count of the graphs it has traced, after each step (``run(step, prompt)``). Dynamo starts afresh:
    what it learned from other models of the same code (a dimension it saw change) would hide a recompile."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    graphs = []
    for step, prompt in enumerate(widths):
        run(step, prompt)
        graphs.append(counters["stats"]["unique_graphs"])
    return graphs


# prompt lengths, one a step: prompts are padded to the longest of each batch, so the width changes every step
WIDTHS = [7, 11, 9, 14, 8, 12, 10]
# rows, one a step: a step's last micro-batch is shorter, and a search's probes differ in micro_batch_size
ROWS = [8, 4, 6, 8, 6, 3, 8]


def _compiled_lm(compile_fn, layers: int = 1):
    """:func:`_lm` (eval mode) compiled in place by ``compile_fn``, and its vocabulary size."""
    lm = _lm(layers).eval()
    compile_fn(lm)
    return lm, lm.config.vocab_size


@pytest.mark.slow  # compiles the whole model on CPU: about 6 s on 2 cores
def test_a_compiled_model_traces_its_forward_once_whatever_the_prompt_widths_and_rows() -> None:
    """The whole-model compilation of a role on one device (here a reference's forward, without gradients)."""
    from tunekit.trainer.parallel import compile_model

    lm, vocab = _compiled_lm(compile_model)

    @torch.no_grad()
    def forward(step: int, prompt: int) -> None:
        b = _batch(step, prompt, 4, vocab, rows=ROWS[step])
        lm(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"],
           logits_to_keep=5)

    graphs = _graphs_per_step(forward, WIDTHS)
    assert graphs[0] > 0  # the first step compiled
    assert graphs[1:] == graphs[:1] * (len(WIDTHS) - 1)  # and no later width or row count added a graph


@pytest.mark.slow
def test_the_compiled_logprobs_trace_once_when_the_first_prompt_width_equals_the_rows() -> None:
    """The response's labels are a slice of ``input_ids`` that starts at the prompt's width: with the slice passed
    as it is, Dynamo's duck sizing tied its storage offset to the logits' row count when both were 64 at the first
    call (a SmolLM2 probe: 64 prompts of 64 tokens), and the next batch of other widths traced again."""
    from tunekit.trainer.batch import _logprobs

    vocab = 11

    def step_(step: int, prompt: int) -> None:
        mb = _batch(step, prompt, 4, vocab, rows=8)
        _logprobs(torch.randn(8, 4, vocab), mb, 0.7, compiled=True)

    graphs = _graphs_per_step(step_, [8, 11, 9])
    assert graphs[0] > 0
    assert graphs[1:] == graphs[:1] * 2, graphs


@pytest.mark.slow  # compiles a small function on CPU, twice
def test_the_compiled_logprobs_hold_the_temperature_as_a_constant_of_the_graph() -> None:
    """The sampling temperature is a constant of the compiled graph, not a float input: Dynamo would pass a float
    as a 0-d float64 CPU tensor, whose C++ kernel every later process loads through a compiler (about 35 s of a
    warm GPU start). A constant traces once per temperature, and the values match the eager function's."""
    from torch._dynamo.utils import counters

    from tunekit.trainer.algos import logprobs_from_logits
    from tunekit.trainer.batch import _logprobs

    torch._dynamo.reset()
    counters.clear()
    mb = _batch(0, 6, 4, 11, rows=8)
    logits = torch.randn(8, 4, 11)
    labels = mb["input_ids"][:, -4:]
    seen = []
    for temperature in (0.7, 0.7, 1.3):
        got = _logprobs(logits, mb, temperature, compiled=True)
        torch.testing.assert_close(got, logprobs_from_logits(logits, labels, temperature))
        seen.append(counters["stats"]["unique_graphs"])
    assert seen[0] == seen[1] < seen[2], seen


@pytest.mark.slow
def test_a_compiled_actor_traces_each_pass_once_whatever_the_prompt_widths_and_rows() -> None:
    """The update's forward and backward, and the logprob forward without gradients: each traced at the first
    step, never again (its micro-batches of 4 rows, then a step's shorter last one)."""
    actor = _actor(True)
    vocab = actor.model.config.vocab_size

    def step_(step: int, prompt: int) -> None:
        # micro-batches of 4 rows and 4 response tokens at the first call: sizes that duck sizing would tie
        mb = _batch(step, prompt, 4, vocab, rows=ROWS[step] + 4)
        actor.update(mb, mini_batch=8, seed=step)
        actor.logprobs(mb)

    graphs = _graphs_per_step(step_, WIDTHS)
    assert graphs[0] > 0
    assert graphs[1:] == graphs[:1] * (len(WIDTHS) - 1)


@pytest.mark.slow
def test_compiled_blocks_see_a_dynamic_batch_and_sequence_from_the_first_call() -> None:
    """The per-block compilation of an FSDP2 role: the blocks' inputs (hidden states, rotary tables, mask) change
    width and rows with the batch, and one trace of the blocks serves every shape."""
    from tunekit.trainer.parallel import compile_blocks

    lm, vocab = _compiled_lm(compile_blocks, layers=2)  # two blocks of one code object

    @torch.no_grad()
    def forward(step: int, prompt: int) -> None:
        b = _batch(step, prompt, 3, vocab, rows=ROWS[step])
        lm(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])

    graphs = _graphs_per_step(forward, WIDTHS[:4])
    assert graphs[0] > 0
    assert graphs[1:] == graphs[:1] * 3


def test_hf_generate_through_compiled_blocks_decodes_eagerly_and_leaves_them_compiled() -> None:
    """An FSDP2 actor compiled per block generates (HF rollout) with the eager blocks: a prefill and decode steps
    with a cache would otherwise trace graphs of their own, one a block, that no training pass uses."""
    from torch._dynamo.utils import counters

    from tunekit.trainer.parallel import compile_blocks
    from tunekit.trainer.rollout.hf import HFRollout

    torch.manual_seed(0)
    lm = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)
    compile_blocks(lm)
    compiled = [b.forward for b in decoder_layers(lm)]
    rollout = HFRollout(model=lm, device=torch.device("cpu"), pad_id=0, eos_id=1, max_new_tokens=3,
                        temperature=1.0, fixed_length=True, shares_actor=True)
    prompts = {"prompt_ids": torch.randint(2, lm.config.vocab_size, (2, 4), generator=torch.Generator().manual_seed(0)),
               "prompt_mask": torch.ones(2, 4, dtype=torch.long)}
    graphs = counters["stats"]["unique_graphs"]
    ids, _ = rollout.generate(prompts, seed=0)
    assert ids.shape == (2, 3)
    assert counters["stats"]["unique_graphs"] == graphs  # nothing traced while decoding
    assert [b.forward for b in decoder_layers(lm)] == compiled


def _overwritten_by_the_next_call(model) -> None:
    """``model``'s forward keeps what a CUDA graph replay keeps: its next call writes over the tensors the last one
    returned (here with NaN, and in place, so autograd also refuses them where a backward still needs them)."""
    forward, last = model.forward, []

    def replay(*args, **kwargs):
        with torch.no_grad():
            for t in last:
                t.detach().fill_(float("nan"))
        out = forward(*args, **kwargs)
        last[:] = [t for t in (out.values() if isinstance(out, dict) else [out]) if isinstance(t, torch.Tensor)]
        return out

    model.forward = replay


def _ppo_roles(device: str, compiled: bool, *, micro_batch: int = 4, cuda_graphs: bool = True):
    """The reference, critic and actor of a PPO recipe with a KL reference and two epochs, built as the trainer
    builds them (the reference and the critic copy the policy before the actor shards it)."""
    torch.manual_seed(0)
    lm = build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)
    r = load_recipe(None, [f"system.device={device}", f"system.compile={str(compiled).lower()}",
                           f"system.cuda_graphs={str(cuda_graphs).lower()}", f"system.batch.micro_batch_size={micro_batch}",
                           "algorithm.ppo_epochs=2", "algorithm.kl_coef=0.05"])
    dist = Dist(device=torch.device(device, 0) if device == "cuda" else torch.device(device))
    return build_ref(r, dist, lm), build_critic(r, dist, lm), build_actor(r, dist, lm)


NORMS = ("actor/grad_norm", "critic/grad_norm")


def _ppo_steps(roles) -> list[dict]:
    """What the roles compute through the passes of PPO steps of changing widths (reference and old logprobs,
    values, both updates), one dict a step; the batches depend on the step alone."""
    ref, critic, actor = roles
    vocab = actor.model.config.vocab_size
    steps = []
    for step, (prompt, response) in enumerate([(5, 6), (9, 6), (5, 6)]):
        mb = _batch(step, prompt, response, vocab)
        mb["returns"] = torch.randn(8, response, generator=torch.Generator().manual_seed(step))
        with torch.no_grad():
            seen = {"ref": ref.logprobs(mb), "values": critic.values(mb), "old": actor.logprobs(mb)}
        batch = mb | {"old_logprobs": seen["old"].cpu(), "old_values": seen["values"].cpu()}
        steps.append(seen | actor.update(batch, mini_batch=8, seed=step) | critic.update(batch, mini_batch=8, seed=step))
    return steps


TENSORS = ("ref", "values", "old")
LOSSES = ("actor/pg_loss", "critic/vf_loss")


def _spread(a: list[dict], b: list[dict]) -> dict[str, float]:
    """How far two runs of the same steps drift apart, per result over every step: the largest absolute difference
    of the logprobs, values and losses, the largest relative difference of the gradient norms."""
    out = {k: max(float((y[k] - x[k]).abs().max()) for x, y in zip(a, b)) for k in TENSORS}
    out |= {k: max(abs(y[k] - x[k]) for x, y in zip(a, b)) for k in LOSSES}
    return out | {k: max(abs(y[k] - x[k]) / abs(x[k]) for x, y in zip(a, b)) for k in NORMS}


def _ppo_steps_alike(a: list[dict] | tuple, b: list[dict] | tuple, *, close: float, loss_abs: float,
                     norm_rel: float) -> None:
    """Two sets of roles (or their :func:`_ppo_steps`) agree on every step's results."""
    a, b = (_ppo_steps(x) if isinstance(x, tuple) else x for x in (a, b))
    _within(_spread(a, b), dict.fromkeys(TENSORS, close) | dict.fromkeys(LOSSES, loss_abs) | dict.fromkeys(NORMS, norm_rel))


def _within(gap: dict[str, float], bound: dict[str, float]) -> None:
    """Every result's gap inside its bound; the message lists those outside, each with its gap and bound."""
    far = {k: (round(gap[k], 6), round(bound[k], 6)) for k in gap if not gap[k] <= bound[k]}
    assert not far, f"(gap, bound) per result: {far}"


@pytest.mark.slow  # two PPO steps of every role, twice: about 1 s on 2 cores once the other tests compiled their graphs
def test_roles_keep_nothing_a_replayed_forward_overwrites() -> None:
    """What ``system.cuda_graphs`` asks of the roles, checked on CPU: no result of one forward is read after the next
    forward ran (a replay writes its outputs where the last one's were), through every pass of a PPO step."""
    plain, replayed = _ppo_roles("cpu", False), _ppo_roles("cpu", False)
    for role in replayed:
        _overwritten_by_the_next_call(role.model)
    _ppo_steps_alike(plain, replayed, close=1e-6, loss_abs=1e-6, norm_rel=1e-5)


@pytest.mark.gpu
def test_graphed_reference_critic_and_old_logprobs_match_the_eager_ones() -> None:
    """The PPO path with ``system.cuda_graphs``: the reference's and the critic's passes without gradients, the
    critic's update, the actor's old logprobs taken between its graphed updates (two epochs over the same widths,
    one width recorded once and replayed a step later) and the actor's weights, each as the eager roles compute them. bf16 kernels that round in another order (Inductor's fused ones,
    or eager ones at another micro-batch) move the gradient norms apart once Adam has moved the weights (it moves a
    weight whose gradient is near 0 by about the learning rate either way), and the next step's logprobs and values
    with them: each graphed result may differ from the eager one by twice the largest of those two spreads, measured
    here on the same steps. Graphs that replayed stale inputs or weights would put them far outside it."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    graphed, plain = _ppo_roles("cuda", True), _ppo_roles("cuda", False)
    assert all(getattr(role.model.forward, "replays_cuda_graphs", False) for role in graphed)
    assert not any(hasattr(role.model.forward, "replays_cuda_graphs") for role in plain)
    start = [m.detach().clone() for m in plain[2].optim.masters]
    eager = _ppo_steps(plain)
    spreads = [_spread(eager, _ppo_steps(_ppo_roles("cuda", False, micro_batch=2))),
               _spread(eager, _ppo_steps(_ppo_roles("cuda", True, cuda_graphs=False)))]
    floor = dict.fromkeys(TENSORS, 2e-2) | dict.fromkeys(LOSSES, 1e-3) | dict.fromkeys(NORMS, 1e-2)
    _within(_spread(eager, _ppo_steps(graphed)), {k: max(floor[k], 2 * max(s[k] for s in spreads)) for k in floor})
    # the actor's weights (fp32 masters under bf16 compute) moved alike over the widths, one of them recorded once and
    # replayed: Adam moves a weight whose gradient is near 0 by about the learning rate either way, so bf16 rounding
    # flips some of those (1% of one tensor's, on an H200); the update as a whole agrees, where weights the graphs
    # left stale or updated twice would put the two updates as far apart as the update is long
    moved = torch.cat([(p - p0).flatten() for p, p0 in zip(plain[2].optim.masters, start)]).norm()
    apart = torch.cat([(q - p).flatten() for p, q in zip(plain[2].optim.masters, graphed[2].optim.masters)]).norm()
    assert moved > 0 and apart <= 0.25 * moved, (apart.item(), moved.item())
