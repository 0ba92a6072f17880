"""How much Python heap torch.compile leaves in a training process, and what a full collection then costs.

Builds a preset's actor (random init, plain module on CPU), compiles it whole (``system.compile``) through three
updates at three sequence lengths, as a probe's first steps do, and times ``gc.collect()`` before, after, and after
``gc.freeze()`` (what ``tunekit.trainer.heap.freeze_heap`` does at the end of each warm-up step). CPU only; the
figures are the heap's, not the GPU's. Writes OUT/heap_after_compile-PRESET.json.

    OMP_NUM_THREADS=2 PYTHONPATH=. python3 benchmarks/heap_after_compile.py --preset qwen2.5-0.5b --out "$OUT"
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402


def timed_collect() -> float:
    t = time.perf_counter()
    gc.collect()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default=None, help="model preset (default: the embedded tiny model)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/out")))
    args = ap.parse_args()
    from tunekit.config import AlgorithmConfig, MemoryConfig
    from tunekit.models import build_causal_lm
    from tunekit.trainer.heap import freeze_heap
    from tunekit.dist import Dist
    from tunekit.trainer.roles.actor import Actor

    torch.manual_seed(0)
    lm = build_causal_lm(path=None, preset=args.preset, vocab_size=None, dtype=torch.float32)
    actor = Actor(lm, algo=AlgorithmConfig(), mem=MemoryConfig(), dist=Dist(), micro_batch=2, temperature=1.0,
                  compile=True)
    res = {"preset": args.preset or "embedded", "torch": torch.__version__, "python": sys.version.split()[0],
           "objects_before": len(gc.get_objects()), "collect_before_s": timed_collect()}
    vocab = lm.config.vocab_size
    for step, (prompt, response) in enumerate([(5, 6), (7, 6), (9, 8)]):
        ids = torch.randint(0, vocab, (2, prompt + response))
        mask = torch.ones_like(ids)
        batch = {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1,
                 "response_mask": torch.ones(2, response, dtype=torch.long), "advantages": torch.randn(2, response)}
        t = time.perf_counter()
        actor.update(batch, mini_batch=2, seed=step)
        res[f"update_{step}_s (compiles)"] = time.perf_counter() - t
    res |= {"objects_after_compile": len(gc.get_objects()), "collect_after_compile_s": timed_collect()}
    res |= {"frozen": freeze_heap(), "objects_tracked_after_freeze": len(gc.get_objects()),
            "collect_after_freeze_s": timed_collect()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"heap_after_compile-{res['preset']}.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
