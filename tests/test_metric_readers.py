"""Whatever reads a probe's records names its metrics through tunekit.metrics, so renaming a metric is one line."""

import io
import tokenize
from pathlib import Path

import tunekit
from tunekit import metrics

READERS = ("estimate", "search", "report", "launch", "cli.py")
NAMES = {v for k, v in vars(metrics).items() if k.isupper() and isinstance(v, str) and "/" in v}


def _spelled(path: Path) -> list[str]:
    toks = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [f"{path.name}:{t.start[0]} {t.string}" for t in toks
            if t.type == tokenize.STRING and t.string[:1] in "\"'" and t.string[1:-1] in NAMES]


def test_readers_spell_no_metric_name_themselves():
    root = Path(tunekit.__file__).parent
    files = [f for r in READERS for f in ([root / r] if r.endswith(".py") else sorted((root / r).rglob("*.py")))]
    assert len(files) > 20 and NAMES >= {"reward/mean", "timing_s/step"}
    assert [s for f in files for s in _spelled(f)] == []
