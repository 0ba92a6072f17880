"""A wheel install (not only an editable one) finds the shipped recipes and price profiles."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # builds and installs a wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # the backend pyproject names, as installed here: an isolated build would first install it afresh, seconds
    # that change nothing the wheel holds
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                          str(ROOT)], capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        pytest.skip(f"cannot build a wheel here (pip wheel needs setuptools>=68 installed): {res.stderr.strip()[-300:]}")
    (whl,) = out.glob("tunekit-*.whl")
    return whl


def test_the_wheel_carries_every_recipe_and_profile(wheel):
    names = {n.split(".data/data/", 1)[-1] for n in zipfile.ZipFile(wheel).namelist()}
    for folder in ("recipes", "profiles"):
        for f in (ROOT / folder).glob("*.yaml"):
            assert f"share/tunekit/{folder}/{f.name}" in names, f


def _user_install() -> tuple[str | None, str | None]:
    """Where the running interpreter's own tunekit distribution is, and the ``tunekit`` command on PATH."""
    code = ("import importlib.metadata as m, shutil\n"
            "try:\n    print(m.distribution('tunekit').locate_file(''))\nexcept m.PackageNotFoundError:\n    print(None)\n"
            "print(shutil.which('tunekit'))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the install, not a checkout on the path
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=env, timeout=120,
                         check=True)
    dist, cmd = res.stdout.split()
    return (None if dist == "None" else dist), (None if cmd == "None" else cmd)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, tuple, tuple]:
    """The wheel installed into a virtual environment of its own, by that environment's pip; the user's install
    (what ``pip install -e .`` put in the running interpreter) before and after."""
    before = _user_install()
    env = tmp_path_factory.mktemp("site") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    py = str(env / "bin" / "python")
    purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # the running interpreter's packages (pip, torch, pydantic) as plain path entries after the environment's own:
    # their .pth files, the editable install's finder among them, are not run there
    outer = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    Path(purelib, "_outer.pth").write_text("\n".join(outer) + "\n")
    # pip of the new environment, told to install beside the running interpreter's tunekit, not over it
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
                    str(wheel)], check=True, timeout=300)
    return env, before, _user_install()


def test_an_installed_wheel_finds_them(installed, tmp_path):
    env, _, _ = installed
    code = ("import tunekit, tunekit.config as c, tunekit.estimate.profiles as p; "
            "print(tunekit.__file__); print(c.RECIPES_DIR); print(p.load_profile('cpu').name)")
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([str(env / "bin" / "python"), "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env=clean, timeout=120)
    assert res.returncode == 0, res.stderr
    module, recipes, profile = res.stdout.split()
    assert module.startswith(str(env)) and recipes == str(env / "share" / "tunekit" / "recipes")
    assert profile == "cpu" and (Path(recipes) / "tiny-ppo.yaml").exists()


def test_installing_the_wheel_leaves_the_users_install_alone(installed):
    _, before, after = installed
    assert after == before  # the same distribution, and `tunekit` still on PATH where it was
    if before[1] is not None:
        res = subprocess.run([before[1], "--help"], capture_output=True, text=True, cwd="/", timeout=120)
        assert res.returncode == 0 and "probe" in res.stdout, res.stderr
