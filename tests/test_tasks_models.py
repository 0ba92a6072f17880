"""The embedded arithmetic workload (prompts, partial-credit reward) and model building (embedded, presets, critic, reference, RM)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from tunekit.workload import models
from tunekit.config import TaskConfig
from tunekit.workload import ArithmeticPrompts, Prompt, PromptSource, build_workload
from tunekit.workload.arithmetic import reward


# ---------------------------------------------------------------- arithmetic workload


def test_arithmetic_prompts_are_correct_and_seeded():
    task = ArithmeticPrompts(max_operand=20)
    prompts = task.sample(200, random.Random(3))
    assert prompts == task.sample(200, random.Random(3))
    for p in prompts:
        a, b = p.text.removesuffix("=").split("+")
        assert p.text.endswith("=") and int(p.answer) == int(a) + int(b) <= 40
        assert 0 <= int(a) <= 20 and 0 <= int(b) <= 20
    assert task.max_completion_chars == 2
    assert isinstance(task, PromptSource)


def test_subtraction_never_negative_and_multiplication_width():
    prompts = ArithmeticPrompts(max_operand=9, ops=("-",)).sample(100, random.Random(0))
    assert all(int(p.answer) >= 0 and "-" not in p.answer for p in prompts)
    assert ArithmeticPrompts(max_operand=20, ops=("+", "*")).max_completion_chars == 3


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("19", 1.0),  # exact
        (" 19 ", 1.0),  # whitespace is stripped
        ("18", 0.5),  # first digit right
        ("1", 0.5),  # one of two characters, too short
        ("199", 2 / 3),  # both right plus an extra character
        ("91", 0.0),  # right digits, wrong places
        ("", 0.0),
        ("abc", 0.0),
    ],
)
def test_score_partial_credit(completion, expected):
    assert reward("12+7=", completion, "19") == pytest.approx(expected)


def test_only_the_exact_answer_scores_one():
    workload = build_workload(TaskConfig())  # the default pair: generated prompts, this reward
    p = Prompt("50+50=", "100")
    assert workload.score(p, "100") == 1.0
    assert all(workload.score(p, c) < 1.0 for c in ("10", "1000", "101", "100 1"))


def test_bad_arithmetic_arguments():
    with pytest.raises(ValueError, match="ops"):
        ArithmeticPrompts(ops=("/",))
    with pytest.raises(ValueError, match="max_operand"):
        ArithmeticPrompts(max_operand=0)


# ---------------------------------------------------------------- tokenizer and embedded model


@pytest.fixture(scope="module")
def tok():
    return models.load_tokenizer(None)


@pytest.fixture(scope="module")
def lm():
    return models.build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)


def test_embedded_tokenizer_round_trips(tok):
    ids = tok("12+7=19").input_ids
    assert len(ids) == 7  # one token per character, nothing added
    assert tok.decode(ids) == "12+7=19"
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == "12+7=19"
    assert tok.pad_token_id == 0 and tok.eos_token_id is not None and tok.pad_token_id != tok.eos_token_id
    assert tok("3*4-1 =", add_special_tokens=False).input_ids == tok("3*4-1 =").input_ids


def test_embedded_model_generates_answers(lm, tok):
    assert lm.config.vocab_size == len(tok)
    assert lm.config.tie_word_embeddings and lm.config.model_type == "qwen2"
    assert models.n_params(lm) < 2_000_000
    tok.padding_side = "left"
    enc = tok(["12+7=", "3+4="], return_tensors="pt", padding=True)
    out = lm.generate(**enc, do_sample=False, max_new_tokens=3, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id)
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    # warmed up: the greedy answer is right even though samples at T=1 are spread
    assert texts == ["19", "7"]


def test_missing_path_names_it():
    with pytest.raises(ValueError, match="/no/such/ckpt"):
        models.build_causal_lm(path="/no/such/ckpt", preset=None, vocab_size=None, dtype=torch.float32)
    with pytest.raises(ValueError, match="/no/such/tok"):
        models.load_tokenizer("/no/such/tok")


# ---------------------------------------------------------------- presets


def test_preset_config_has_real_shapes():
    c = models.build_config("qwen2.5-0.5b")
    assert (c.model_type, c.hidden_size, c.num_hidden_layers) == ("qwen2", 896, 24)
    assert (c.num_attention_heads, c.num_key_value_heads, c.intermediate_size) == (14, 2, 4864)
    assert c.vocab_size == 151936 and c.tie_word_embeddings
    c7 = models.build_config("qwen2.5-7b", vocab_size=19)
    assert (c7.hidden_size, c7.num_hidden_layers, c7.num_key_value_heads, c7.vocab_size) == (3584, 28, 4, 19)
    assert not c7.tie_word_embeddings
    llama = models.build_config("llama-3-8b")
    assert (llama.model_type, llama.hidden_size) == ("llama", 4096)
    assert (llama.num_attention_heads, llama.num_key_value_heads, llama.num_hidden_layers) == (32, 8, 32)
    assert llama.rope_parameters["rope_theta"] == 500000.0 and llama.vocab_size == 128256


def test_unknown_preset_lists_presets():
    with pytest.raises(ValueError, match="unknown model preset 'gpt5'.*qwen2.5-0.5b"):
        models.build_causal_lm(path=None, preset="gpt5", vocab_size=None, dtype=torch.float32)


def test_preset_random_init_is_seeded_and_leaves_global_rng_alone():
    kw = dict(path=None, preset="tiny-arith", vocab_size=19, dtype=torch.float32)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = models.build_causal_lm(**kw, seed=1)
    assert torch.equal(torch.rand(1), before)
    b = models.build_causal_lm(**kw, seed=1)
    c = models.build_causal_lm(**kw, seed=2)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_path_and_preset_together_is_an_error():
    with pytest.raises(ValueError, match="not both"):
        models.build_causal_lm(path=str(models.EMBEDDED_MODEL_DIR), preset="tiny-arith", vocab_size=None,
                               dtype=torch.float32)


# ---------------------------------------------------------------- critic, reference, reward model


def test_critic_values_shape_and_zero_init(lm, tok):
    critic = models.CriticModel.from_actor(lm)
    tok.padding_side = "left"
    enc = tok(["12+7=19", "1+1=2"], return_tensors="pt", padding=True)
    values = critic(enc.input_ids, enc.attention_mask)
    assert values.shape == enc.input_ids.shape and values.dtype == torch.float32
    assert torch.count_nonzero(values) == 0  # zero-initialised head
    # the backbone is a copy: training the critic leaves the actor alone
    critic.backbone.norm.weight.data.add_(1.0)
    assert not torch.equal(critic.backbone.norm.weight, lm.model.norm.weight)
    assert len(critic.backbone.layers) == lm.config.num_hidden_layers  # FSDP finds blocks at backbone.layers


def test_a_critic_starts_from_the_actors_weights():
    actor = models.build_causal_lm(path=None, preset=None, vocab_size=None, dtype=torch.float32)
    critic = models.CriticModel.from_actor(actor)
    assert torch.equal(critic.backbone.embed_tokens.weight, actor.model.embed_tokens.weight)
    ids = torch.tensor([[5, 6, 14, 11, 17]])
    critic.value_head.weight.data.fill_(0.1)
    values = critic(ids, torch.ones_like(ids))
    values.sum().backward()
    assert values.shape == (1, 5) and critic.backbone.layers[0].mlp.up_proj.weight.grad is not None


def test_critic_returns_its_own_values_tensor_not_a_view(lm):
    critic = models.CriticModel.from_actor(lm)
    torch.nn.init.normal_(critic.value_head.weight)
    critic.value_head.bias.data.fill_(0.5)
    ids = torch.tensor([[5, 6, 14, 11, 17], [3, 4, 5, 6, 7]])
    values = critic(ids, torch.ones_like(ids))
    hidden = critic.backbone(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    torch.testing.assert_close(values, critic.value_head(hidden)[..., 0])
    # a view returned by an FSDP2-wrapped module loses its pre-backward hook to a later in-place op (FSDP2 warns)
    assert values._base is None


def test_reference_is_frozen_copy(lm):
    ref = models.build_reference(lm)
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    assert any(p.requires_grad for p in lm.parameters())
    assert ref.model.embed_tokens.weight.data_ptr() != lm.model.embed_tokens.weight.data_ptr()


def test_reward_model_scores_each_sequence(tmp_path, tok):
    config = AutoConfig.for_model("qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=len(tok),
                                  num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path)
    rm = models.RewardModel(str(tmp_path))
    tok.padding_side = "left"
    enc = tok(["12+7=19", "1+1=2"], return_tensors="pt", padding=True)
    scores = rm(enc.input_ids, enc.attention_mask)
    assert scores.shape == (2,) and scores.dtype == torch.float32
    # left padding does not change a row's score
    alone = rm(*(t[1:, -5:] for t in (enc.input_ids, enc.attention_mask)))
    assert torch.allclose(alone, scores[1:], atol=1e-5)
    with pytest.raises(ValueError, match="/no/such/rm"):
        models.RewardModel("/no/such/rm")
