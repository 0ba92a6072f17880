"""Prompts reach the model the same way in every runner: through the tokenizer's chat template (``task.chat_template:
auto``) or as they are; the reward receives plain text."""

from __future__ import annotations

import sys

import pytest
import torch

from tunekit.config import load_recipe
from tunekit.placement.dist import Dist
from tunekit.trainer.build import build_task, load_tokenizer
from tunekit.trainer.loop import Trainer
from tunekit.workload.chat import PromptFormat, prompt_format

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny checkpoint whose byte-level BPE tokenizer has ChatML special tokens and a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("chat-model")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    texts = [f"What is {a} + {b}? Reply with only the number. user assistant system" for a in range(30) for b in range(5)]
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  bos_token="<|im_start|>")
    tok.chat_template = CHATML
    tok.save_pretrained(d)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(d)
    return d


def builtin_ids(recipe, prompts) -> list[list[int]]:
    """The prompt ids tunekit's own trainer feeds the rollout (padding removed)."""
    trainer = Trainer(recipe, None, tokenizer=load_tokenizer(recipe), task=build_task(recipe), dist=Dist(), timer=None)
    enc = trainer.prompt_batch(prompts)
    return [ids[mask.bool()].tolist() for ids, mask in zip(enc["prompt_ids"], enc["prompt_mask"])]


def chat_recipe(model_dir, *sets):
    return load_recipe("tiny-grpo", [f"model.path={model_dir}", "runner=trl", "system.device=cpu",
                                     "system.batch.prompts_per_step=4", "probe.steps=2", *sets])


@pytest.mark.parametrize("sets", [[], ["task.system_prompt=Answer with a number."], ["task.chat_template=none"]])
def test_builtin_and_trl_feed_the_same_prompt_ids(chat_model, tmp_path, monkeypatch, sets):
    """The same rows through tunekit's trainer and through TRL's GRPOTrainer (built as the TRL runner builds it, its
    conversational rows tokenized by TRL itself) give the same ids, and the reward gets plain text."""
    pytest.importorskip("trl", reason="trl is not installed (the trl extra)")
    from tunekit import rundir
    from tunekit.runners.trl_entry import MODEL_ENV, build_trainer

    (tmp_path / "seen_reward.py").write_text(
        "SEEN = []\n\n\ndef score(prompt, response, answer):\n    SEEN.append((prompt, response, answer))\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = chat_recipe(chat_model, "task.reward=seen_reward:score", *sets)
    run = tmp_path / "run"
    run.mkdir()
    rundir.write_config(run, r)
    monkeypatch.setenv(MODEL_ENV, str(chat_model))
    trainer, _ = build_trainer(r, run, rank=1)  # rank 1: no step log
    rows = trainer.train_dataset["prompt"][:4]
    prompts = build_task(r).probe_prompts(r.system.batch.prompts_per_step, 1, r.probe.seed)
    theirs, _, _ = trainer._tokenize_prompts(rows)
    ours = builtin_ids(r, prompts)
    assert [list(t) for t in theirs] == ours
    tok = load_tokenizer(r)
    text = tok.decode(ours[0])
    if "task.chat_template=none" in sets:
        assert isinstance(rows[0], str) and text == prompts[0].text
    else:
        assert rows[0][-1] == {"role": "user", "content": prompts[0].text}
        assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
        assert ("<|im_start|>system\nAnswer with a number.<|im_end|>" in text) == bool(sets)
    # the user's function sees the row's prompt and the completion as strings, whatever TRL passes
    import seen_reward

    seen_reward.SEEN.clear()
    (fn,) = trainer.reward_funcs
    from tunekit.runners.trl_entry import ROW_COLUMN, prompt_text

    assert prompt_text(rows[0]) == prompts[0].text  # what samples.parquet keeps as the prompt

    completion = [{"role": "assistant", "content": "19"}] if isinstance(rows[0], list) else "19"
    assert fn(prompts=[rows[0]], completions=[completion], **{ROW_COLUMN: [0]}) == [1.0]
    assert seen_reward.SEEN == [(prompts[0].text, "19", prompts[0].answer)]


def test_a_tokenizer_without_a_template_feeds_the_text_and_says_so_once(capsys):
    from tunekit.workload import chat

    chat.say_once.cache_clear()
    r = load_recipe(None)
    tok = load_tokenizer(r)  # the embedded character tokenizer: no chat template
    fmt = prompt_format(r.task, tok)
    prompt_format(r.task, tok)
    assert fmt == PromptFormat(chat=False) and fmt.render(tok, "12+7=") == "12+7="
    err = capsys.readouterr().err
    assert err.count("has no chat template") == 1
    assert prompt_format(load_recipe(None, ["task.chat_template=none"]).task, tok) == PromptFormat(chat=False)
    assert "task.system_prompt" not in capsys.readouterr().err
    # a system prompt with no system turn to go in: said once, not dropped in silence
    system = load_recipe(None, ["task.system_prompt=Be brief."]).task
    assert prompt_format(system, tok).render(tok, "12+7=") == "12+7="
    prompt_format(system, tok)
    assert capsys.readouterr().err.count("task.system_prompt is not used") == 1


def test_the_embedded_default_feeds_the_prompts_as_before():
    from tunekit.trainer.batch import encode_prompts

    r = load_recipe(None)
    prompts = build_task(r).probe_prompts(4, 1, 0)
    tok = load_tokenizer(r)
    want = encode_prompts(tok, [p.text for p in prompts])["prompt_ids"]
    got = Trainer(r, None, tokenizer=tok, task=build_task(r), dist=Dist(), timer=None).prompt_batch(prompts)["prompt_ids"]
    assert torch.equal(got, want)


def test_verl_gets_the_conversation_and_keeps_the_checkpoints_template(chat_model, tmp_path):
    """verl's dataset rows hold the same messages; the actor's chat template is overridden only where the recipe's
    prompts go in as they are."""
    import pandas as pd

    from tunekit.runners.verl import AR, overrides
    from tunekit.runners.verl_data import write_data

    key = f"{AR}.model.custom_chat_template"
    r = chat_recipe(chat_model, "task.system_prompt=Be brief.", "runner=verl")
    assert key not in overrides(r, model=str(chat_model), data_dir="/d", steps=2)
    train, _ = write_data(r, tmp_path, 2)
    first = pd.read_parquet(train)["prompt"][0]
    p0 = build_task(r).probe_prompts(r.system.batch.prompts_per_step, 1, r.probe.seed)[0]
    assert [dict(m) for m in first] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": p0.text}]
    plain = chat_recipe(chat_model, "task.chat_template=none", "runner=verl")
    assert key in overrides(plain, model=str(chat_model), data_dir="/d", steps=2)


def test_verls_own_rendering_feeds_builtins_ids(chat_model):
    """verl's agent loop tokenization (its model config and continuous-token builder) on the chat checkpoint."""
    pytest.importorskip("verl", reason="verl is not installed (the verl extra cannot share an environment with dev)")
    from tunekit.runners.verl_entry import verl_renders_prompts

    r = chat_recipe(chat_model, "runner=verl")
    texts = [p.text for p in build_task(r).probe_prompts(4, 1, r.probe.seed)]
    verl_renders_prompts(r, chat_model, texts)  # raises ConfigError where verl's ids differ from builtin's


def test_the_trl_launch_script_feeds_trl_the_same_conversations(chat_model, tmp_path, monkeypatch):
    """The handed-back TRL script, run with TRL's ``train`` stubbed: its dataset holds the conversations the probe
    fed, for the checkpoint the recipe names, with its tokenizer."""
    import trl

    from tunekit.runners.trl import TrlRunner
    from tunekit.runners.trl_entry import grpo_workload

    r = chat_recipe(chat_model, "task.system_prompt=Be brief.")
    text = TrlRunner().handback(r, 2).files["trl_launch.py"]
    assert repr(str(chat_model)) in text
    built = {}
    monkeypatch.setattr(trl.GRPOTrainer, "train", lambda self: built.setdefault("trainer", self))
    monkeypatch.setattr(sys, "argv", ["trl_launch.py"])
    monkeypatch.chdir(tmp_path)
    exec(compile(text, "trl_launch.py", "exec"), {"__doc__": text.split('"""')[1]})  # noqa: S102 - the script under test
    trainer = built["trainer"]
    rows, _ = grpo_workload(r.task, per_step=r.system.batch.prompts_per_step, steps=2, seed=r.probe.seed,
                            tokenizer=load_tokenizer(r))
    assert trainer.train_dataset["prompt"] == rows["prompt"]
    assert rows["prompt"][0][0] == {"role": "system", "content": "Be brief."}
    assert trainer.processing_class.chat_template == CHATML
