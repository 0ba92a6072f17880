"""A wheel install (not only an editable one) finds the shipped recipes and price profiles."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        pytest.skip(f"cannot build a wheel here (pip wheel needs setuptools from PyPI): {res.stderr.strip()[-300:]}")
    (whl,) = out.glob("tunekit-*.whl")
    return whl


def test_the_wheel_carries_every_recipe_and_profile(wheel):
    names = {n.split(".data/data/", 1)[-1] for n in zipfile.ZipFile(wheel).namelist()}
    for folder in ("recipes", "profiles"):
        for f in (ROOT / folder).glob("*.yaml"):
            assert f"share/tunekit/{folder}/{f.name}" in names, f


def test_an_installed_wheel_finds_them(wheel, tmp_path):
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(env)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--prefix", str(env), str(wheel)],
                   check=True, timeout=300)
    code = ("import tunekit, tunekit.config as c, tunekit.profiles as p; "
            "print(tunekit.__file__); print(c.RECIPES_DIR); print(p.load_profile('cpu').name)")
    res = subprocess.run([str(env / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    module, recipes, profile = res.stdout.split()
    assert module.startswith(str(env)) and recipes == str(env / "share" / "tunekit" / "recipes")
    assert profile == "cpu" and (Path(recipes) / "tiny-ppo.yaml").exists()
