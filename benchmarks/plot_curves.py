"""The learning curves of ``results/smollm2_curves.json`` as a picture for the results page: per runner, the mean
exact-answer rate over its seeds and the band between the lowest and the highest seed, each a 10-step moving mean.

    python3 benchmarks/plot_curves.py benchmarks/results/smollm2_curves.json benchmarks/screenshots/smollm2_curves.png

plotly draws the figure into a page that carries plotly.js (no network), and a headless Chromium (``chromium`` on
the PATH) takes its screenshot.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WINDOW = 10
"""Steps in each moving mean: one step's rate is 512 answers, noisy from step to step."""
COLORS = {"builtin": "31, 119, 180", "trl": "214, 39, 40"}
NAMES = {"builtin": "tunekit builtin", "trl": "TRL GRPOTrainer"}


def moving_mean(xs: list[float], window: int = WINDOW) -> list[float]:
    """The mean of each step's last ``window`` values (fewer at the start)."""
    return [sum(xs[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(xs))]


def figure(result: dict):
    import plotly.graph_objects as go

    fig = go.Figure()
    for runner, c in result["per_runner"].items():
        rgb, steps = COLORS.get(runner, "90, 90, 90"), list(range(len(c["mean_exact_rate"])))
        lo, hi = moving_mean(c["min_exact_rate"]), moving_mean(c["max_exact_rate"])
        fig.add_trace(go.Scatter(x=steps + steps[::-1], y=hi + lo[::-1], fill="toself", line={"width": 0},
                                 fillcolor=f"rgba({rgb}, 0.18)", hoverinfo="skip", showlegend=False))
        fig.add_trace(go.Scatter(x=steps, y=moving_mean(c["mean_exact_rate"]), line={"color": f"rgb({rgb})", "width": 2.5},
                                 name=f"{NAMES.get(runner, runner)}: mean of {c['seeds']} seeds (band: lowest to highest)"))
    fig.update_layout(width=900, height=480, template="plotly_white", margin={"l": 60, "r": 20, "t": 50, "b": 50},
                      title=f"{result['recipe']}: exact-answer rate, {WINDOW}-step moving mean "
                            f"({result['machine']}, {result['date']})",
                      xaxis_title="step", yaxis_title="exact-answer rate", yaxis_range=[0, 1],
                      legend={"x": 0.35, "y": 0.08})
    return fig


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    src, png = Path(argv[0]), Path(argv[1]).resolve()
    if (browser := shutil.which("chromium") or shutil.which("chromium-browser")) is None:
        print("plot_curves.py needs chromium on the PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    fig = figure(json.loads(src.read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "curves.html"
        fig.write_html(page, include_plotlyjs=True, config={"staticPlot": True})
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp}/profile",
                        "--hide-scrollbars", "--window-size=900,480", f"--screenshot={png}", page.as_uri()],
                       check=True, capture_output=True, timeout=120)
    print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
