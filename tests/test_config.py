"""Recipe loading: defaults, overrides, and one clear sentence for each kind of bad input."""

from __future__ import annotations

import pytest

from tunekit.config import RECIPES_DIR, Recipe, apply_overrides, dump_recipe, list_keys, load_recipe
from tunekit.config.errors import ConfigError


def test_embedded_default_has_every_knob():
    r = load_recipe(None)
    assert r.system.controller == "spmd" and r.system.rollout.backend == "hf"
    assert set(r.system.device_map) == {"actor", "critic", "ref", "rollout", "reward"}
    assert r.system.batch.samples_per_step == r.system.batch.prompts_per_step
    for key in ("system.memory.param_offload", "system.memory.gradient_checkpointing", "system.batch.micro_batch_size",
                "system.rollout.gpu_memory_utilization", "algorithm.name"):
        assert key in list_keys()


def test_overrides_are_typed_yaml():
    r = load_recipe(None, ["system.batch.micro_batch_size=4", "algorithm.name=grpo", "system.batch.samples_per_prompt=4",
                           "system.device_map={actor: [0,1], critic: [0,1], ref: [0,1], rollout: [0,1], reward: [0,1]}"])
    assert r.system.batch.micro_batch_size == 4 and r.algorithm.name == "grpo"
    assert r.system.world_size == 2 and r.system.devices == [0, 1]


def test_resolved_dump_round_trips():
    r = load_recipe("tiny-grpo", ["probe.steps=7"])
    import yaml

    again = Recipe.model_validate(yaml.safe_load(dump_recipe(r)))
    assert again == r and again.probe.steps == 7


def test_every_shipped_recipe_validates():
    names = [p.stem for p in RECIPES_DIR.glob("*.yaml")]
    assert "tiny-grpo" in names
    for n in names:
        load_recipe(n)


@pytest.mark.parametrize("override, words", [
    (["nope.key=1"], ["nope.key", "no such key"]),
    (["system.batch.micro_bach_size=4"], ["no such key", "did you mean system.batch.micro_batch_size?"]),
    (["system.device_map={actor: [0"], ["system.device_map={actor: [0", "not valid YAML", "close its brackets"]),
    (["system.batch.micro_batch_size=abc"], ["system.batch.micro_batch_size"]),
    (["probe.steps=0"], ["probe.steps", "greater than 0"]),
    (["system.rollout.gpu_memory_utilization=1.5"], ["gpu_memory_utilization", "(0, 1]"]),
    (["system.batch.micro_batch_size=7"], ["micro_batch_size 7", "divide"]),
    (["algorithm.name=grpo"], ["samples_per_prompt"]),
    (["system.device_map={actor: [0], pilot: [1]}"], ["unknown role 'pilot'"]),
    (["missing-equals"], ["dotted.key=value"]),
    (["algorithm.kl_loss=true"], ["algorithm", "kl_loss has no effect while kl_coef is 0"]),
    (["algorithm.kl_estimator=k3"], ["kl_estimator has no effect while kl_coef is 0"]),
    (["algorithm.kl_coef=0.1", "algorithm.kl_estimator=k2"], ["algorithm.kl_estimator", "'k2'"]),
    (["algorithm.clip_ratio_c=1"], ["algorithm.clip_ratio_c", "greater than 1"]),
    (["algorithm.loss_agg_mode=seq-mean"], ["algorithm.loss_agg_mode", "'seq-mean'"]),
])
def test_bad_overrides_name_the_key(override, words):
    with pytest.raises(ConfigError) as e:
        load_recipe(None, override)
    for w in words:
        assert w in e.value.message


def test_a_text_key_takes_the_text_as_given_even_where_yaml_reads_a_mapping():
    r = load_recipe(None, ["task.prompt_template=Q: {question}", "task.system_prompt='Be: brief'"])
    assert (r.task.prompt_template, r.task.system_prompt) == ("Q: {question}", "Be: brief")  # quotes still quote
    assert load_recipe(None, ["task.prompt_template={question}="]).task.prompt_template == "{question}="
    assert load_recipe(None, ["task.system_prompt=null"]).task.system_prompt is None
    with pytest.raises(ConfigError, match="system.device_map"):  # a mapping key still takes YAML
        load_recipe(None, ["system.device_map={actor: [0"])


def test_a_value_yaml_cannot_read_but_whose_brackets_close_is_text():
    # a Llama-2 style template: not YAML, meant as it is
    assert load_recipe(None, ["task.prompt_template=[INST] {prompt} [/INST]"]).task.prompt_template == "[INST] {prompt} [/INST]"


def test_bad_files(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("model:\n  preset: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*not valid YAML"):
        load_recipe(str(bad_yaml))
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("model:\n  presett: qwen2.5-0.5b\n")
    with pytest.raises(ConfigError, match=r"unknown.yaml: unknown key 'model.presett'"):
        load_recipe(str(unknown))
    wrong_type = tmp_path / "wrong.yaml"
    wrong_type.write_text("system:\n  batch:\n    prompts_per_step: many\n")
    with pytest.raises(ConfigError, match=r"wrong.yaml: key 'system.batch.prompts_per_step'"):
        load_recipe(str(wrong_type))
    with pytest.raises(ConfigError, match="not found"):
        load_recipe(str(tmp_path / "absent.yaml"))


def test_apply_overrides_does_not_touch_input():
    raw = {"probe": {"steps": 3}}
    out = apply_overrides(raw, ["probe.steps=5"])
    assert raw == {"probe": {"steps": 3}} and out["probe"]["steps"] == 5


def test_one_role_override_keeps_the_other_roles():
    r = load_recipe(None, ["system.device_map.rollout=[1]"])
    assert r.system.device_map["rollout"] == [1] and r.system.device_map["actor"] == [0]


GRPO = ["algorithm.name=grpo", "system.batch.samples_per_prompt=4"]


@pytest.mark.parametrize("sets, in_loss, kind", [
    (["algorithm.kl_coef=0.1"], False, "k1"),                                  # PPO: in the reward, k1
    (GRPO + ["algorithm.kl_coef=0.1"], True, "k3"),                            # GRPO: a loss term, k3
    (GRPO + ["algorithm.kl_coef=0.1", "algorithm.kl_loss=false"], False, "k1"),
    (["algorithm.kl_coef=0.1", "algorithm.kl_loss=true", "algorithm.kl_estimator=mse"], True, "mse"),
])
def test_where_the_kl_acts(sets, in_loss, kind):
    a = load_recipe(None, sets).algorithm
    assert a.uses_ref and a.kl_in_loss == in_loss and a.kl_in_reward == (not in_loss) and a.kl_kind == kind


def test_no_kl_without_a_coefficient():
    a = load_recipe(None, GRPO).algorithm
    assert not a.uses_ref and not a.kl_in_loss and not a.kl_in_reward


def test_clip_ranges_default_to_clip_ratio():
    a = load_recipe(None, ["algorithm.clip_ratio=0.3"]).algorithm
    assert (a.clip_low, a.clip_high) == (0.3, 0.3)
    a = load_recipe(None, ["algorithm.clip_ratio_high=0.28"]).algorithm
    assert (a.clip_low, a.clip_high) == (0.2, 0.28)


def test_the_loss_choices_are_the_ones_the_math_knows():
    from typing import get_args

    from tunekit.config import AlgorithmConfig
    from tunekit.trainer import algos

    fields = AlgorithmConfig.model_fields
    assert get_args(fields["loss_agg_mode"].annotation) == algos.LOSS_AGG_MODES
    kl_literal = next(a for a in get_args(fields["kl_estimator"].annotation) if a is not type(None))
    assert get_args(kl_literal) == algos.KL_KINDS
