"""Systems knobs must not change what is learned: the embedded default, same seed, as one process and
spmd over 2 ranks for 30 steps, and the single controller split and with 2-rank groups for the first 10.

- The single controller with one rank per role group, roles split over two devices, runs the same
  math on the same samples as one process (its rollout replica gets the actor's exact weights every
  step by broadcast, and samples with the same seed): its curve must match step for step.
- With every role on [0,1] it runs what spmd over 2 ranks runs (FSDP2 over 2 ranks, each
  half of the batch sampled with seed + rank; the weights through the object store): its curve must
  match spmd's step for step.
- No schedule depends on the probe's length, so a shorter probe runs the first steps of a longer one:
  the single controller's runs (a Ray cluster each, the costly ones) stop after the steps compared.
- spmd over 2 ranks samples the second half of the batch with another seed, so its curve
  is another draw of the same learning: its last-10-step mean reward must be within
  REWARD_TOL of one process's.
"""

from __future__ import annotations

import warnings

import pandas as pd
import pytest

from tunekit.config import ROLES, load_recipe
from tunekit.launch.failure import signal_death
from tunekit.launch.probe import run_probe
from tunekit.rundir import read_log

STEPS = 30
# a small KL penalty keeps the reference role (and its worker group) in every configuration compared
BASE = ["probe.seed=0", "probe.warmup_steps=3", "profiler.comm_steps=0", "system.device=cpu",
        "algorithm.kl_coef=0.001"]
SINGLE = ["system.controller=single"]
CONFIGS = {
    "single_process": [],
    "spmd_2": [f"system.device_map.{r}=[0,1]" for r in ROLES],
    # split roles, and weights broadcast from actor rank 0 (gloo here, NCCL on GPU) instead of the object store
    "single_split": SINGLE + ["system.weight_sync=collective"]
                    + [f"system.device_map.{r}=[0]" for r in ("actor", "critic", "ref")]
                    + [f"system.device_map.{r}=[1]" for r in ("rollout", "reward")],
    "single_2_ranks": SINGLE + [f"system.device_map.{r}=[0,1]" for r in ROLES],
}
# Last-10-step mean reward (30 steps, this recipe, asset of commit 91abccc), measured:
# one process, seeds 0..7: 0.407 +- 0.046 (sd); spmd 2 ranks, seeds 0..5: 0.430 +- 0.038.
# With the same seed (same prompts, the second half sampled differently) the gap between
# the two was 0.030, 0.061, 0.001, 0.018, 0.027, 0.079 for seeds 0..5: RMS 0.045.
# 0.15 is 3.3 RMS, so an honest change (a new asset, another seed) fails it with odds
# under 1e-3; 0.1 would fail about 3% of them. This check only catches gross breakage (a
# wrong reward, a collapse); the step-for-step checks are the sharp ones.
REWARD_TOL = 0.15
# Same samples, same math, same shapes: measured bit-identical (difference 0.0).
EXACT_TOL = 1e-6
# single_2_ranks pads prompts to the whole batch's longest, spmd to its half's, so results
# differ in the last float bits; the samples stayed identical for all 30 steps when measured,
# but one late flip is possible, so the steps compared are the first 10, where the samples must match exactly.
SAME_SAMPLES_STEPS = 10
# the steps each configuration runs: the noise check needs 30, the step-for-step ones the first 10
CONFIG_STEPS = {"single_process": STEPS, "spmd_2": STEPS, "single_split": SAME_SAMPLES_STEPS,
                "single_2_ranks": SAME_SAMPLES_STEPS}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, pd.DataFrame]:
    out = tmp_path_factory.mktemp("equivalence")
    frames = {}
    with pytest.MonkeyPatch.context() as mp:
        # one thread per rank: measured not to change these numbers, and much faster on 2 busy cores
        mp.setenv("OMP_NUM_THREADS", "1")
        for name, sets in CONFIGS.items():
            sets = BASE + sets + [f"probe.steps={CONFIG_STEPS[name]}"]
            result = run_probe(load_recipe(None, sets), out=out, run_id=name)
            if result.status == "failed" and signal_death(read_log(result.run_dir)):
                # a rank killed by a signal (seen once in CI: SIGABRT in spmd's rank 1, not reproduced in 18 runs
                # under load) is not what these tests compare; said, and run once more
                warnings.warn(f"{name}: {result.summary['reason']}; running it again", stacklevel=1)
                result = run_probe(load_recipe(None, sets), out=out, run_id=f"{name}-again")
            assert result.status == "ok", (name, result.summary["reason"])
            frames[name] = pd.read_parquet(result.run_dir / "steps.parquet")
            assert len(frames[name]) == CONFIG_STEPS[name], name
    return frames


def _last10(frame: pd.DataFrame) -> float:
    return float(frame["reward/mean"].tail(10).mean())


def _max_diff(a: pd.DataFrame, b: pd.DataFrame, key: str, steps: int) -> float:
    return float((a[key].head(steps) - b[key].head(steps)).abs().max())


def _weights_synced_every_step(frame: pd.DataFrame) -> None:
    """The rollout replica received the actor's weights every step, in a timed phase."""
    assert (frame["rollout/weight_sync_bytes"] > 0).all()
    assert (frame["timing_s/update_weights"] > 0).all()


@pytest.mark.slow
def test_single_controller_matches_one_process_step_for_step(runs):
    ref, got = runs["single_process"], runs["single_split"]
    for key in ("reward/mean", "actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "actor/ref_kl"):
        diff = _max_diff(ref, got, key, SAME_SAMPLES_STEPS)
        assert diff <= EXACT_TOL, (key, diff)
    _weights_synced_every_step(got)


@pytest.mark.slow
def test_single_controller_2_ranks_matches_spmd_2_ranks(runs):
    spmd, single = runs["spmd_2"], runs["single_2_ranks"]
    assert _max_diff(spmd, single, "reward/mean", SAME_SAMPLES_STEPS) <= EXACT_TOL
    # the global gradient norm (FSDP reduces it over both ranks) agrees while the samples do
    rel = (spmd["actor/grad_norm"] - single["actor/grad_norm"]).abs() / spmd["actor/grad_norm"]
    assert rel.head(SAME_SAMPLES_STEPS).max() <= 1e-4
    _weights_synced_every_step(single)  # through the object store: stale weights would change the samples above


@pytest.mark.slow
def test_spmd_2_ranks_within_noise_of_one_process(runs):
    gap = abs(_last10(runs["spmd_2"]) - _last10(runs["single_process"]))
    assert gap <= REWARD_TOL, gap


@pytest.mark.slow
def test_the_trainer_learns(runs):
    """The equivalence checks compare configurations that would be broken alike (an advantage of the wrong sign
    unlearns in every one of them): the reward itself must rise. Measured on this recipe at seed 0: 0.346 over the
    first ten steps, 0.449 over the last ten (with the advantages' sign flipped: 0.210, then 0.010)."""
    one = runs["single_process"]["reward/mean"]
    assert one.tail(10).mean() - one.head(10).mean() >= 0.05
