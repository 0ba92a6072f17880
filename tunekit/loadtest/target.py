"""What a load test loads: a server the user already runs (``--url``, ``loadtest.url``, or the recipe's
``system.rollout.server_url``), or the recipe's own rollout engine as a ``vllm serve`` that tunekit starts on the
first rollout replica's GPUs with the recipe's engine knobs, through the same launcher a probe's server uses
(:class:`tunekit.trainer.rollout.server_process.ServerProcess`), and stops afterwards with its process group."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunekit import rundir
from tunekit.config import Recipe
from tunekit.config.errors import ConfigError, TunekitError
from tunekit.loadtest.client import Endpoint, ModelsError, first_model

if TYPE_CHECKING:  # the rollout package imports torch: loaded only when a server is asked or started
    from tunekit.trainer.rollout.server_process import ServerProcess


@dataclass
class Target:
    """A server ready for requests; ``server`` is set when tunekit started it (and stops it)."""

    endpoint: Endpoint
    tokenizer: str | None
    """The server's tokenizer directory when tunekit started it (None: the recipe's, :func:`recipe_tokenizer`)."""
    server: ServerProcess | None = None
    rollout: dict[str, Any] | None = None
    """The recipe's ``system.rollout`` when the server is the recipe's own, else None."""
    model: dict[str, Any] = field(default_factory=dict)

    def describe(self, client: str) -> dict[str, Any]:
        """What ``loadtest.json`` records of the target (no API key)."""
        return {"url": self.endpoint.url, "model": self.endpoint.model, "client": client,
                "started_by_tunekit": self.server is not None, "rollout": self.rollout, "policy": self.model}

    def problem(self) -> str | None:
        """Why the server can no longer answer (it died), or None."""
        if self.server is None:
            return None
        from tunekit.trainer.rollout.server_process import ServerError

        try:
            self.server.check()
        except ServerError as e:
            return str(e)
        return None


def api_key(recipe: Recipe) -> str | None:
    return os.environ.get(recipe.loadtest.api_key_env) or None


def served_model(url: str, key: str | None, *, where: str, timeout_s: float = 10.0) -> str:
    """The first model the server lists at ``/v1/models``; a ConfigError (one sentence) when it does not answer."""
    try:
        return first_model(url, key, timeout_s=timeout_s)
    except ModelsError as e:
        if e.status in (401, 403):
            hint = "put its API key in the environment variable loadtest.api_key_env names"
        elif e.status is None and str(e).startswith("no answer"):
            hint = "start the server or fix the URL"
        else:
            hint = "give the URL of an OpenAI-compatible server (such as vLLM's)"
        raise ConfigError(f"{where} {url} gives no model at /v1/models ({e}); {hint}.") from None


def _policy(recipe: Recipe) -> dict[str, Any]:
    m = recipe.model
    return {"preset": m.preset, "path": m.path}


def recipe_tokenizer(recipe: Recipe) -> str:
    """The recipe's tokenizer directory (``vllm bench serve`` counts prompt tokens with it)."""
    from tunekit.workload.models import EMBEDDED_MODEL_DIR

    m = recipe.model
    return str(m.tokenizer_path or m.path or EMBEDDED_MODEL_DIR)


def _given(recipe: Recipe) -> tuple[str | None, str]:
    """The server the recipe names (``loadtest.url``, else ``system.rollout.server_url``; None: tunekit starts one)
    and the key that named it, for its errors."""
    where = "loadtest.url (--url)" if recipe.loadtest.url else "system.rollout.server_url"
    return recipe.loadtest.url or recipe.system.rollout.server_url, where


def preflight(recipe: Recipe) -> str | None:
    """What the target needs, checked before anything is prepared (the model converted, the prompts rendered): a
    given server answers with a model (returned, for :func:`open_target`), or this machine can start one (None)."""
    given, where = _given(recipe)
    if given:
        return served_model(given, api_key(recipe), where=where)
    check_can_start(recipe)
    return None


@contextmanager
def open_target(recipe: Recipe, *, out_dir: Path, max_tokens: int, model: str | None = None) -> Iterator[Target]:
    """The server to load, ready: at ``loadtest.url`` (``--url``), else at ``system.rollout.server_url``, else the
    recipe's own rollout engine, started here and stopped on exit (whatever happens inside). ``model``: the given
    server's model, where :func:`preflight` has asked it already."""
    key = api_key(recipe)
    given, where = _given(recipe)
    if given:
        model = model or served_model(given, key, where=where)
        own = recipe.system.rollout.server_url == given
        yield Target(Endpoint(given, model, key), None,
                     rollout=recipe.system.rollout.model_dump(mode="json") if own else None, model=_policy(recipe))
        return
    check_can_start(recipe)
    tmp = Path(tempfile.mkdtemp(prefix="tunekit-loadtest-model-"))
    server = None
    try:
        server, model_dir = _start(recipe, tmp, out_dir, max_tokens)
        yield Target(Endpoint(server.url, served_model(server.url, None, where="the vLLM server tunekit started at")),
                     str(model_dir), server=server, rollout=recipe.system.rollout.model_dump(mode="json"),
                     model=_policy(recipe))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def check_can_start(recipe: Recipe) -> None:
    """A server tunekit starts needs vLLM and a GPU here."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError("tunekit loadtest starts a vLLM server for the recipe's rollout, and vLLM is not installed; "
                          "run `pip install -e \".[vllm]\"` on a GPU machine, or give --url of a running server.")
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("tunekit loadtest starts a vLLM server for the recipe's rollout, which needs an NVIDIA GPU; "
                          "run it on a GPU machine, or give --url of a running server.")


def server_for(recipe: Recipe, model_dir: Path, out_dir: Path, max_tokens: int) -> ServerProcess:
    """The recipe's rollout server, not started: ``vllm serve`` of ``model_dir`` with the recipe's engine knobs on the
    first rollout replica's GPUs, taking text prompts, logging into ``out_dir``."""
    from tunekit.placement.ports import free_port
    from tunekit.trainer.rollout.checkpoint import max_model_len
    from tunekit.trainer.rollout.server_process import ServerProcess
    from tunekit.trainer.rollout.vllm_server import server_command, server_env

    port = free_port()
    cmd = server_command(model_dir, port=port, recipe=recipe, max_len=max_model_len(model_dir, max_tokens),
                         sleep=False, token_ids_only=False)
    log_path, pgid_path = rundir.server_files(out_dir, "vllm_server")
    gpus = (recipe.system.rollout_replicas or [[0]])[0]
    return ServerProcess(cmd, url=f"http://127.0.0.1:{port}", log_path=log_path, pgid_path=pgid_path,
                         env=server_env(gpus))


def _start(recipe: Recipe, tmp: Path, out_dir: Path, max_tokens: int) -> tuple[ServerProcess, Path]:
    from tunekit.runners.model_dir import prepare_model
    from tunekit.trainer.rollout.server_process import ServerError

    model_dir = prepare_model(recipe, tmp, gpu=True)
    server = server_for(recipe, model_dir, out_dir, max_tokens)
    try:
        server.start(timeout_s=recipe.system.rollout.server_timeout_s)
    except ServerError as e:
        raise TunekitError(str(e)) from None
    return server, model_dir
