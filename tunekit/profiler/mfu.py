"""Model FLOPs utilisation, as torchtitan defines it: flops/token × tokens/s / peak."""

from __future__ import annotations


def flops_per_token(n_params: int, n_layers: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) of a dense transformer.

    ``6 * N`` for the parameter matmuls plus ``12 * L * H * S`` for attention
    scores and values (PaLM appendix B; torchtitan's ``get_num_flop_per_token``).
    """
    for name, value in (("n_params", n_params), ("n_layers", n_layers), ("hidden", hidden), ("seq_len", seq_len)):
        if value < 0:
            raise ValueError(f"flops_per_token: {name} must be >= 0, got {value}.")
    return 6.0 * n_params + 12.0 * n_layers * hidden * seq_len


def mfu(
    tokens_per_s_per_gpu: float, flops_per_token: float, peak_tflops: float | None
) -> float | None:
    """Fraction (0..1) of the GPU's peak FLOP/s achieved; None when the peak is unknown.

    ``peak_tflops`` is the dense peak of the dtype trained in (e.g. bf16) from
    the hardware profile; an unknown GPU gives None, never a guessed peak.
    """
    if peak_tflops is None:
        return None
    if peak_tflops <= 0:
        raise ValueError(f"peak_tflops must be > 0 (or None when unknown), got {peak_tflops}.")
    return tokens_per_s_per_gpu * flops_per_token / (peak_tflops * 1e12)


def update_mfu(*, tokens: float, seq_len: float, epochs: int, n_params: int, n_layers: int, hidden: int,
               seconds: float, gpus: int, peak_tflops: float | None, head_params: int = 0,
               head_tokens: float | None = None) -> float | None:
    """MFU of an update phase: ``tokens`` each pass forward and backward ``epochs`` times on ``gpus`` GPUs.

    ``head_params`` of ``n_params`` (the LM head) run on ``head_tokens`` only, when the trainer computes
    logits for the response positions alone (``logits_to_keep``); None: on every token.
    Activation recomputation (gradient checkpointing) is not counted, as MFU conventionally does not.
    """
    if peak_tflops is None or seconds <= 0 or gpus <= 0:
        return None
    head_tokens = tokens if head_tokens is None else head_tokens
    flops = tokens * flops_per_token(n_params - head_params, n_layers, hidden, int(round(seq_len))) \
        + head_tokens * 6.0 * head_params
    return mfu(flops * epochs / seconds / gpus, 1.0, peak_tflops)
