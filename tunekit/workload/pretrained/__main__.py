"""``python -m tunekit.workload.pretrained (--preset NAME | --path FILE.gguf)``: the converted checkpoint's directory,
converted first where this machine's cache lacks it. What a handed-back command that starts a server on a converted
model asks for its ``--model``."""

from __future__ import annotations

import argparse
import sys

from tunekit.config import ModelConfig
from tunekit.config.errors import TunekitError
from tunekit.workload.pretrained import PRETRAINED, checkpoint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tunekit.workload.pretrained", description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--preset", help="a pretrained preset, e.g. smollm2-135m")
    which.add_argument("--path", help="a .gguf file")
    args = p.parse_args(argv)
    if args.preset is not None and args.preset not in PRETRAINED:
        print(f"error: --preset {args.preset}: not a pretrained preset tunekit converts; give one of "
              f"{', '.join(PRETRAINED)}.", file=sys.stderr)
        return 2
    try:
        print(checkpoint(ModelConfig(preset=args.preset, path=args.path)))
    except (TunekitError, ValueError) as e:
        print(f"error: {getattr(e, 'message', e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
