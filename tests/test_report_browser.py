"""Open a generated report in headless Chromium with the network cut: every figure draws, no console message.

Needs Debian's ``chromium`` (``.ci/run`` installs it); skipped with the reason otherwise.
Screenshots at 1400 and 900 px wide land in ``test-artifacts/report-<width>.png``.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from report_synth import write_run, write_search, write_study
from search_record import recorded_search

from tunekit.report import build_report

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "") if p and Path(p).exists()), None)
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
EVIL = "<script>alert(1)</script>"

pytestmark = [pytest.mark.slow, pytest.mark.service("Chromium"),
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; .ci/run does)")]


def _chromium(profile: Path, url: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", "--no-first-run", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
           "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=15000", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    runs = [write_run(root / "runs", f"p{i:02d}", status=("ok", "ok", "oom", "ok", "timeout", "ok")[i], reason="killed" if i in (2, 4) else "",
                      reward=0.35 + 0.08 * i, yuan=30 - 3 * i, seed=i, gpus=1 + i % 2,
                      overrides=(f"system.batch.micro_batch_size={(1, 2, 4, 8)[i % 4]}",) + ((f"name={EVIL}",) if i == 0 else ()),
                      extra={"rollout/staleness_steps": 1} if i == 5 else None)
            for i in range(6)]
    write_search(root, runs, best=3, baseline=0, equivalence=[f"{EVIL} learned differently"])
    write_study(root / "study.db", runs)
    return build_report([root], root / "report.html")


def test_every_figure_renders_without_console_messages(report, tmp_path):
    html = report.read_text()
    figures = re.findall(r'data-figure="(\w+)"', html)
    assert figures == ["cost", "phases", "comm", "memory", "rewards", "history", "importance"]
    drills = html.count('class="drill"')
    res = _chromium(tmp_path / "profile", f"{report.as_uri()}#expand-all", "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    console = [line for line in res.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, "\n".join(console)
    plots = dom.count('class="plotly-graph-div')
    drawn = len(re.findall(r'class="plotly-graph-div[^"]*js-plotly-plot', dom))
    assert plots == len(figures) + drills and drawn == plots, f"{drawn} of {plots} figures drawn"
    assert dom.count('class="main-svg"') >= plots
    assert EVIL not in dom and "&lt;script&gt;alert(1)&lt;/script&gt;" in dom


@pytest.mark.parametrize("width", [1400, 900])
def test_screenshot(report, tmp_path, width):
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"report-{width}.png"
    shot.unlink(missing_ok=True)
    res = _chromium(tmp_path / "profile", report.as_uri(), f"--window-size={width},3600", f"--screenshot={shot}", "--hide-scrollbars")
    assert res.returncode == 0, res.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 50_000


# ---------------------------------------------------------------- the report of a recorded search, at a glance

SCREENSHOTS = (Path(__file__).resolve().parent.parent / "benchmarks" / "screenshots" if os.environ.get("TUNEKIT_UPDATE_SCREENSHOTS")
               else ARTIFACTS)
"""Where the recorded search's screenshots go: the results page's folder with TUNEKIT_UPDATE_SCREENSHOTS=1, else
test-artifacts/ (the report's date changes every run)."""
VIEWPORTS = {"desktop": (1400, 900), "phone": (390, 844)}

MEASURE = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const out = [];
  for (const sec of document.querySelectorAll("section")) {
    const edge = sec.getBoundingClientRect().right + 1;
    for (const el of sec.querySelectorAll("h2, p, li, pre, .kpi, .tablewrap, .figure")) {
      if (el.closest(".tablewrap") && !el.classList.contains("tablewrap")) continue;  // a table scrolls inside its card
      if (el.closest("details:not([open])")) continue;
      if (el.getBoundingClientRect().right > edge || el.scrollWidth > el.clientWidth + 1 && !el.matches(".tablewrap, pre, .figure"))
        out.push(sec.id + ": " + el.tagName + " " + el.textContent.slice(0, 60));
    }
  }
  if (document.documentElement.scrollWidth > window.innerWidth + 1) out.push("the page scrolls sideways");
  const h = document.querySelector("#headline");
  document.body.setAttribute("data-overflow", JSON.stringify(out));
  document.body.setAttribute("data-headline", h ? h.innerText : "");
}, 500));
</script></body>"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("recorded")
    recorded_search(home)
    cwd = Path.cwd()
    os.chdir(home)  # the report names its sources as the user gave them: search-out/tiny-ppo, as the README runs it
    try:
        return build_report([Path("search-out/tiny-ppo")], Path("search-out/tiny-ppo/report.html")).resolve()
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("view", list(VIEWPORTS))
def test_the_report_of_a_recorded_search_reads_at_a_glance(recorded, tmp_path, view):
    width, height = VIEWPORTS[view]
    page = tmp_path / "measured.html"
    page.write_text(recorded.read_text().replace("</body>", MEASURE))
    res = _chromium(tmp_path / "profile", page.as_uri(), f"--window-size={width},{height}", "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    head = re.search(r'data-headline="([^"]*)"', res.stdout).group(1)
    # the headline's trial, its reward over the confirmation round's seeds and the threshold, as the answer gives them
    assert "Cheapest configuration that reaches the threshold within noise: trial 12" in head
    assert "0.407 [0.392, 0.422] over seeds 0, 1, 2" in head and "reward vs threshold 0.4" in head
    overflow = json.loads(html.unescape(re.search(r'data-overflow="([^"]*)"', res.stdout).group(1)))
    assert overflow == [], overflow
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / f"report-{view}.png"
    res = _chromium(tmp_path / "profile2", recorded.as_uri(), f"--window-size={width},{height}", f"--screenshot={shot}",
                    "--hide-scrollbars")
    assert res.returncode == 0 and shot.stat().st_size > 20_000
