"""Build the actor, critic, reference and reward models from a path, a preset or the embedded checkpoint.

Nothing here downloads: paths load with ``local_files_only=True`` and presets are
random-initialised from a literal shape table. Bad input raises ``ValueError``
(the caller turns it into a user error).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerFast,
)

if TYPE_CHECKING:  # seconds of imports that a process building no model (a driver, a rule reward) need not pay
    from transformers import PreTrainedModel


def import_model_code() -> None:
    """Import transformers' model code now, which building the first model would otherwise do: a process that times its
    imports apart from its model load calls this among its imports."""
    import transformers.modeling_utils  # noqa: F401


EMBEDDED_MODEL_DIR = Path(__file__).parents[1] / "assets" / "tiny-arith"

# Real shapes of public checkpoints (their config.json), plus the embedded model's
# (head_dim 64, a size every vLLM attention backend supports).
# Built with random weights: a probe measures cost, and learning is checked on the
# embedded task, so no weights are fetched.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-arith": dict(
        model_type="qwen2", hidden_size=128, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, vocab_size=19, max_position_embeddings=128,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
    ),
    # the embedded model's family at twice its width and layers: a second small shape for CPU checks of how cost scales
    "tiny-arith-4l": dict(
        model_type="qwen2", hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, vocab_size=19, max_position_embeddings=128,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
    ),
    "qwen2.5-3b": dict(
        model_type="qwen2", hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
    ),
    "llama-3-8b": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
        tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        rms_norm_eps=1e-5,
    ),
}


def n_params(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def matmul_shape(path: str | None, preset: str | None, trust_remote_code: bool = False) -> dict[str, int]:
    """Parameters of the LM that take part in matmuls (an untied input embedding is a lookup), layers, hidden
    size and vocabulary (a critic has no LM head: ``vocab * hidden`` fewer).

    Built on the meta device from the config alone: no weights are read or allocated.
    """
    config, _ = _text_config(path, preset, trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    n = n_params(model)
    if not getattr(config, "tie_word_embeddings", False):
        n -= model.get_input_embeddings().weight.numel()
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return {"n_params": n, "n_layers": int(text.num_hidden_layers), "hidden": int(text.hidden_size),
            "vocab": int(text.vocab_size)}


def _text_config(path: str | None, preset: str | None, trust_remote_code: bool):
    """The model's config and its text part; a pretrained preset or a ``.gguf`` path is read from its converted
    checkpoint (:mod:`tunekit.workload.pretrained`, converted first if the cache does not hold it)."""
    from tunekit.config import ModelConfig
    from tunekit.workload.pretrained import checkpoint, converts

    if converts(source := ModelConfig(path=path, preset=preset)):
        path, preset = str(checkpoint(source)), None
    config = build_config(preset) if preset is not None else AutoConfig.from_pretrained(
        _existing_dir(path), local_files_only=True, trust_remote_code=trust_remote_code)
    return config, (config.get_text_config() if hasattr(config, "get_text_config") else config)


def causal_lm_config(path: str | None, preset: str | None, trust_remote_code: bool = False):
    """The config :func:`build_causal_lm` builds the model from (a converted checkpoint's for a pretrained preset)."""
    return _text_config(path, preset, trust_remote_code)[0]


def attention_heads(path: str | None, preset: str | None, trust_remote_code: bool = False) -> tuple[int, int]:
    """(attention heads, key/value heads) of the model's config: what a tensor-parallel engine splits."""
    _, text = _text_config(path, preset, trust_remote_code)
    heads = int(text.num_attention_heads)
    return heads, int(getattr(text, "num_key_value_heads", None) or heads)


def memory_shape(path: str | None, preset: str | None, trust_remote_code: bool = False) -> dict[str, int]:
    """Every parameter (tied weights once), layers, hidden size, vocabulary, the key/value width of one layer
    (key/value heads x head size) and the MLP's width: what memory scales with. Built on the meta device from the config alone."""
    config, text = _text_config(path, preset, trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    return {"n_params": n_params(model), "n_layers": int(text.num_hidden_layers), "hidden": int(text.hidden_size),
            "vocab": int(text.vocab_size), "kv_dim": kv_heads * head_dim,
            "intermediate": int(getattr(text, "intermediate_size", None) or 4 * text.hidden_size)}


def load_tokenizer(path: str | None) -> PreTrainedTokenizerFast:
    """The tokenizer at ``path`` (None: the embedded character tokenizer); pad falls back to EOS."""
    where = _existing_dir(path)
    try:
        tok = AutoTokenizer.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a tokenizer from {where!r}: {_first_line(e)}") from e
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def build_config(preset: str, vocab_size: int | None = None, **overrides: Any) -> PretrainedConfig:
    """The transformers config of ``preset``, with ``vocab_size`` (and any other field) overridden."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of: {', '.join(PRESETS)}")
    kwargs = dict(PRESETS[preset])
    model_type = kwargs.pop("model_type")
    if vocab_size is not None:
        kwargs["vocab_size"] = vocab_size
    kwargs.update(overrides)
    return AutoConfig.for_model(model_type, **kwargs)


def build_causal_lm(
    *,
    path: str | None,
    preset: str | None,
    vocab_size: int | None,
    dtype: torch.dtype,
    trust_remote_code: bool = False,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> PreTrainedModel:
    """A causal LM: loaded from ``path``, random-initialised from ``preset`` (seeded), or the embedded one.

    ``vocab_size`` overrides a preset's vocabulary (e.g. to the embedded tokenizer's
    size); a checkpoint's vocabulary comes with it. ``device`` places a preset's
    weights as they are created, so a large preset never materialises on CPU first.
    """
    if path is not None and preset is not None:
        raise ValueError("give a model path or a preset, not both")
    if preset is not None:
        config = build_config(preset, vocab_size)
        where = torch.device(device or "cpu")
        # seed a forked generator so building a model leaves the caller's RNG streams alone
        cuda = [where.index if where.index is not None else torch.cuda.current_device()] if where.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda), where:
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
        return model
    where = _existing_dir(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            where, dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a causal LM from {where!r}: {_first_line(e)}") from e
    return model.to(device) if device is not None else model


class CriticModel(nn.Module):
    """A value model: the actor's backbone (no LM head) plus a linear value head.

    ``backbone`` keeps the Hugging Face name so decoder blocks are found at
    ``backbone.layers`` for FSDP sharding. The value head is zero-initialised, so
    the first values are 0 whatever the backbone says.
    """

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        self.value_head = nn.Linear(backbone.config.hidden_size, 1, dtype=torch.float32)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        self.value_head.to(next(backbone.parameters()).device)

    @classmethod
    def from_actor(cls, actor: PreTrainedModel) -> CriticModel:
        """A critic whose backbone is a copy of ``actor``'s (the actor is left untouched)."""
        return cls(copy.deepcopy(_backbone_of(actor)))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids, attention_mask: [B, T] → values [B, T] (float32), one per token position."""
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        head = self.value_head
        # [B, T, H] @ [H] makes a new [B, T] tensor; squeezing the head's [B, T, 1] output would return a view, and
        # FSDP2 warns that an in-place op on a view its module returned skips the backward all-gather
        return torch.matmul(hidden.to(head.weight.dtype), head.weight[0]).add(head.bias).float()

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.backbone.gradient_checkpointing_enable(**kwargs)


def build_reference(actor: nn.Module) -> nn.Module:
    """A frozen copy of ``actor`` in eval mode: the KL anchor."""
    ref = copy.deepcopy(actor).eval()
    ref.requires_grad_(False)
    return ref


class RewardModel(nn.Module):
    """A sequence-classification reward model from a local path; one float32 score per sequence.

    The score is read at each row's last non-pad token, so left and right padding
    both work (the config's ``pad_token_id`` must be set, as it is for any RM).
    """

    def __init__(self, path: str, *, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False) -> None:
        super().__init__()
        where = _existing_dir(path)
        try:
            self.model = AutoModelForSequenceClassification.from_pretrained(
                where, num_labels=1, dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code
            ).eval()
        except (OSError, ValueError) as e:
            raise ValueError(f"cannot load a reward model from {where!r}: {_first_line(e)}") from e
        self.model.requires_grad_(False)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: [B, T] → scores [B] (float32)."""
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return logits[:, 0].float()


def _backbone_of(lm: PreTrainedModel) -> PreTrainedModel:
    # Hugging Face causal LMs keep the decoder under base_model_prefix ("model" for Qwen2/Llama).
    backbone = getattr(lm, lm.base_model_prefix, None)
    if backbone is None:
        raise ValueError(f"cannot find the backbone of {type(lm).__name__} to build a critic")
    return backbone


def _existing_dir(path: str | None) -> str:
    if path is None:
        return str(EMBEDDED_MODEL_DIR)
    if not Path(path).is_dir():
        raise ValueError(
            f"model path {path!r} is not a local directory; nothing is downloaded, so point it at a checkpoint on disk"
        )
    return str(path)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
