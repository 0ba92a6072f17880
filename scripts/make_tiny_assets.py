"""Make the embedded checkpoint: a character tokenizer plus a warmed-up, over-dispersed model.

Supervised steps teach the arithmetic task (greedy reward near 1.0). The final
norm is then scaled down until sampling at temperature 1.0 scores only
``--target`` (partial credit, 0.4 by default): the model knows the answers but
its samples spread, so a 100-step PPO probe visibly raises the reward by
sharpening the policy. The final norm is also stored small (``--norm-gain``)
so that sharpening is what Adam's steps move fastest. Deterministic for a given
seed, thread count and torch build.

    python scripts/make_tiny_assets.py                       # → tunekit/assets/tiny-arith (2 CPU cores, ~20 s)
    python scripts/make_tiny_assets.py --preset qwen2.5-0.5b --out /data/arith-0.5b --steps 400 --device cuda
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from tunekit.workload.models import EMBEDDED_MODEL_DIR, build_causal_lm, n_params
from tunekit.workload import ArithmeticPrompts, Prompt, Workload
from tunekit.workload.arithmetic import reward

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list("0123456789+-*= ")


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, decode concatenates; ``<pad>`` is id 0.

    No ``<bos>`` is added (as with Qwen tokenizers), so a prompt encodes the same
    with or without ``add_special_tokens``; the token exists for code that asks.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
        clean_up_tokenization_spaces=False, model_max_length=128,
    )


def sft_batch(tok: PreTrainedTokenizerFast, prompts: list[Prompt], device: torch.device) -> dict[str, torch.Tensor]:
    """Right-padded ``prompt answer <eos>`` rows; the loss sees only answer and EOS tokens."""
    rows, labels = [], []
    for p in prompts:
        prompt_ids = tok(p.text).input_ids
        answer_ids = tok.convert_tokens_to_ids(list(p.answer)) + [tok.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(map(len, rows))
    pad = lambda xs, v: xs + [v] * (width - len(xs))  # noqa: E731
    return {
        "input_ids": torch.tensor([pad(r, tok.pad_token_id) for r in rows], device=device),
        "attention_mask": torch.tensor([pad([1] * len(r), 0) for r in rows], device=device),
        "labels": torch.tensor([pad(lab, -100) for lab in labels], device=device),
    }


@torch.no_grad()
def mean_reward(model, tok, task: Workload, prompts: list[Prompt], *, sample: bool, seed: int) -> float:
    """Mean task score of completions generated the way a rollout does (left padding, stop at EOS)."""
    model.eval()
    tok.padding_side = "left"
    enc = tok([p.text for p in prompts], return_tensors="pt", padding=True).to(model.device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(
            **enc, do_sample=sample, temperature=1.0 if sample else None, top_k=0 if sample else None,
            top_p=1.0 if sample else None, max_new_tokens=task.max_completion_chars + 1,
            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        )
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    model.train()
    return sum(task.score(p, t) for p, t in zip(prompts, texts)) / len(prompts)


def warm_up(model, tok, task: Workload, args: argparse.Namespace, eval_prompts: list[Prompt]) -> None:
    """Supervised steps on ``prompt answer <eos>`` with a cosine-decayed learning rate."""
    device, rng = model.device, random.Random(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(i / args.steps, 1.0))))
    model.train()
    for step in range(1, args.steps + 1):
        batch = sft_batch(tok, task.sample(args.batch, rng), device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % args.eval_every == 0 or step == args.steps:
            sampled = mean_reward(model, tok, task, eval_prompts, sample=True, seed=args.seed)
            greedy = mean_reward(model, tok, task, eval_prompts, sample=False, seed=args.seed)
            print(f"sft step {step:5d}  loss {loss.item():.3f}  reward sampled(T=1) {sampled:.3f}  greedy {greedy:.3f}",
                  flush=True)


@torch.no_grad()
def shrink_final_norm(model, gain: float) -> None:
    """Store the final norm ``gain`` times smaller without changing what the model computes.

    In a pre-norm decoder every sublayer reads a normalised residual, so scaling
    the embeddings and every residual write (attention ``o_proj``, MLP
    ``down_proj``) by ``gain`` scales the residual stream and nothing else; the
    LM head (tied to the embeddings, or scaled here when untied) grows by
    ``gain`` and the final norm shrinks by it. Adam moves each weight by about
    its learning rate per step, so the small final norm (which sets how sharp
    sampling is) moves ``gain`` times faster in relative terms and the large
    rest moves slower: RL can sharpen the policy within a short probe without
    a large learning rate shaking everything else.
    """
    backbone = getattr(model, model.base_model_prefix)
    backbone.embed_tokens.weight.mul_(gain)
    for layer in backbone.layers:
        layer.self_attn.o_proj.weight.mul_(gain)
        layer.mlp.down_proj.weight.mul_(gain)
    if model.get_output_embeddings().weight is not backbone.embed_tokens.weight:
        model.get_output_embeddings().weight.mul_(gain)
    backbone.norm.weight.div_(gain)


@torch.no_grad()
def temper(model, tok, task: Workload, eval_prompts: list[Prompt], *, target: float, seed: int) -> float:
    """Scale the final norm by the largest ``alpha`` in (0, 1] whose sampled reward is at most ``target``.

    Logits scale by ``alpha`` (the LM head has no bias), i.e. sampling at T=1
    behaves like the SFT model at temperature 1/alpha: the answer stays the mode
    (greedy reward unchanged) while samples spread, the way a pretrained model
    knows more than its first sample shows. RL then has a reward gap to close
    by sharpening. Returns ``alpha``.
    """
    norm = getattr(model, model.base_model_prefix).norm.weight
    base = norm.detach().clone()

    def reward_at(alpha: float) -> float:
        norm.copy_(base * alpha)
        return mean_reward(model, tok, task, eval_prompts, sample=True, seed=seed)

    if reward_at(1.0) <= target:
        return 1.0
    lo, hi = 0.0, 1.0  # reward_at(lo) <= target < reward_at(hi)
    for _ in range(12):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if reward_at(mid) <= target else (lo, mid)
    norm.copy_(base * lo)
    return lo


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny-arith", help="architecture from tunekit.workload.models.PRESETS (random init)")
    ap.add_argument("--out", type=Path, default=EMBEDDED_MODEL_DIR, help="where the checkpoint and tokenizer go")
    ap.add_argument("--steps", type=int, default=500, help="SFT steps")
    ap.add_argument("--target", type=float, default=0.4,
                    help="sampled (T=1) reward the saved model starts RL from; negative: keep the SFT model as is")
    ap.add_argument("--norm-gain", type=float, default=8.0,
                    help="store the final norm this many times smaller (same function; see shrink_final_norm)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lr", type=float, default=None,
                    help="peak SFT learning rate (default: 1e-3 tiny-arith, 3e-4 otherwise)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-n", type=int, default=512)
    ap.add_argument("--max-operand", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-dtype", choices=["float32", "bfloat16"], default=None,
                    help="dtype of the saved weights (default: float32 for tiny-arith, bfloat16 otherwise)")
    args = ap.parse_args()
    if args.lr is None:
        args.lr = 1e-3 if args.preset == "tiny-arith" else 3e-4
    return args


def main() -> None:
    args = parse_args()
    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    tok = build_char_tokenizer()
    task = Workload(ArithmeticPrompts(max_operand=args.max_operand), reward)
    model = build_causal_lm(
        path=None, preset=args.preset, vocab_size=len(tok), dtype=torch.float32, seed=args.seed, device=args.device
    )
    for key in ("bos", "eos", "pad"):
        setattr(model.config, f"{key}_token_id", getattr(tok, f"{key}_token_id"))
    print(f"{args.preset}: {n_params(model) / 1e6:.2f}M parameters, vocab {len(tok)}, device {args.device}")
    eval_prompts = task.sample(args.eval_n, random.Random(args.seed + 1))
    warm_up(model, tok, task, args, eval_prompts)
    shrink_final_norm(model, args.norm_gain)
    alpha = 1.0 if args.target < 0 else temper(model, tok, task, eval_prompts, target=args.target, seed=args.seed)
    sampled = mean_reward(model, tok, task, eval_prompts, sample=True, seed=args.seed + 2)
    greedy = mean_reward(model, tok, task, eval_prompts, sample=False, seed=args.seed)

    save_dtype = args.save_dtype or ("float32" if args.preset == "tiny-arith" else "bfloat16")
    model.to(getattr(torch, save_dtype))
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tok.padding_side = "right"
    tok.save_pretrained(args.out)
    for f in args.out.iterdir():
        f.chmod(0o644)  # safetensors writes 0600; the asset ships in the package
    print(
        f"saved {args.out} after {args.steps} SFT steps in {time.perf_counter() - t0:.0f}s: "
        f"final norm x{alpha / args.norm_gain:.4f}, "
        f"reward sampled(T=1) {sampled:.3f}, greedy {greedy:.3f} (on {args.eval_n} prompts)"
    )


if __name__ == "__main__":
    main()
