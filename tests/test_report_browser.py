"""The HTML report in a real headless browser (Debian's chromium): layout and screenshot.

Skipped, with the reason, where no chromium is installed (``make test`` installs it
where it can). The run is synthetic but has the metric keys of a calculator training
run (61 of them), 60 steps with an evaluation every 10.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from turnrl.io import append_jsonl
from turnrl.report import write_report

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)"
)
WIDTH, HEIGHT = 1280, 1400
TAGS = ("easy", "hard")


def calculator_like_run(run_dir: Path, steps: int = 60, seed: int = 0) -> Path:
    """metrics.jsonl with a calculator run's keys: rising success, falling loss, noise."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True)

    def episode(prefix: str, t: float) -> dict[str, float]:
        out = {}
        for suffix in ("", *(f"_{tag}" for tag in TAGS)):
            level = 0.2 + 0.6 * t + 0.05 * rng.standard_normal()
            out[f"{prefix}success{suffix}"] = float(np.clip(level, 0, 1))
            out[f"{prefix}tool_rate{suffix}"] = float(np.clip(t + 0.1 * rng.random(), 0, 1))
            out[f"{prefix}turns{suffix}"] = 1.0 + t + 0.1 * rng.random()
            out[f"{prefix}return{suffix}"] = out[f"{prefix}success{suffix}"]
        out[f"{prefix}malformed_rate"] = 0.05 * (1 - t)
        out[f"{prefix}truncated_rate"] = 0.0
        return out

    for step in range(steps + 1):
        t = step / steps
        row: dict[str, float] = {"step": step}
        if step % 10 == 0:
            row.update(episode("eval_", t), eval_unseen=0.75)
        if step:
            row.update(episode("", t))
            for k, label in enumerate(("0", "1", "2plus")):
                row[f"adv_mean_turn{label}"] = 0.1 * k * rng.standard_normal()
                row[f"adv_std_turn{label}"] = 1.0 - 0.2 * k + 0.05 * rng.random()
            row.update(
                zero_adv_group_frac=float(rng.random() < 0.3) * 0.125,
                adv_abs_mean=0.7 + 0.05 * rng.random(),
                loss=math.exp(-3 * t) * rng.random(),
                pg_loss=math.exp(-3 * t) * rng.random(),
                kl_loss=0.0,
                approx_kl_old=1e-3 * rng.random(),
                clip_frac=0.02 * rng.random(),
                clip_frac_low=0.01 * rng.random(),
                clip_frac_high=0.01 * rng.random(),
                ratio_mean=1.0 + 1e-3 * rng.standard_normal(),
                grad_norm=0.5 + rng.random(),
                episodes=64,
                env_steps=64 * step,
                tokens=900 * step,
                n_tokens=900 + 50 * rng.random(),
                tokens_all=2000.0,
                tokens_unique=1500.0,
                tokens_computed=2000.0,
                computed_over_unique=1.33,
                unique_over_all=0.75,
                rollout_env_steps=100 + 10 * rng.random(),
                seconds_credit=0.01 * rng.random(),
                seconds_env=0.02 * rng.random(),
                seconds_sampling=0.5 + 0.1 * rng.random(),
                seconds_update=0.4 + 0.1 * rng.random(),
                seconds_step=1.0 + 0.1 * rng.random(),
            )
        append_jsonl(run_dir / "metrics.jsonl", row)
    (run_dir / "config.toml").write_text('label = "calculator grpo"\n')
    return run_dir


PROBE = """
<script>
window.addEventListener("load", () => {
  const rect = (el) => el ? el.getBoundingClientRect().toJSON() : null;
  const images = [...document.images];
  const probe = {
    height: document.documentElement.scrollHeight,
    width: document.documentElement.scrollWidth,
    heldout: rect(document.getElementById("heldout")),
    firstPlot: rect(document.querySelector("#section-learning-curves img")),
    headings: [...document.querySelectorAll("h2")].map((h) => h.textContent),
    images: images.length,
    loaded: images.filter((i) => i.complete && i.naturalWidth > 0).length,
    visiblePlots: images.filter((i) => i.getBoundingClientRect().height > 0).length,
  };
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify(probe);
  document.body.appendChild(out);
});
</script>
"""


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run(
        [CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120, check=True
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("browser")
    run = calculator_like_run(root / "calculator")
    old = os.umask(0o022)
    try:
        return write_report([run], root / "report.html", title="calculator")
    finally:
        os.umask(old)


def test_layout_in_the_browser(report: Path, tmp_path: Path) -> None:
    """Measured by the browser after load: what is where, and that every plot loaded."""
    page = tmp_path / "probe.html"
    page.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    done = chromium(
        f"--window-size={WIDTH},{HEIGHT}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        page.as_uri(),
        profile=tmp_path / "profile",
    )
    probe = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', done.stdout).group(1))
    assert probe["headings"][:4] == ["Held-out evaluation", "Learning curves", "Rollouts", "Credit"]
    assert probe["heldout"]["top"] < 300  # the before/after table opens the page
    assert probe["firstPlot"]["top"] < HEIGHT  # learning curves in the first screen
    assert probe["images"] > 10 and probe["loaded"] == probe["images"]
    assert probe["width"] <= WIDTH  # no sideways scrolling
    assert 2000 < probe["height"] < 7000, probe["height"]  # was 13,700 px


def test_screenshot_shows_table_and_plots(report: Path, tmp_path: Path) -> None:
    from PIL import Image

    shot = tmp_path / "report.png"
    chromium(
        f"--window-size={WIDTH},{HEIGHT}",
        f"--screenshot={shot}",
        report.as_uri(),
        profile=tmp_path / "profile",
    )
    image = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert image.shape == (HEIGHT, WIDTH, 3)
    header_grey = np.all(image == (0xF3, 0xF3, 0xF3), axis=-1)  # table header cells
    assert header_grey[:250].sum() > 2000
    blue = np.all(np.abs(image - (0x1F, 0x77, 0xB4)) < 24, axis=-1)  # the first curve colour
    assert blue[250:].sum() > 500  # plots rendered below the table
    dark = image.sum(axis=-1) < 200  # text
    assert dark[:250].sum() > 1000


def test_file_is_readable_and_small(report: Path) -> None:
    assert report.stat().st_mode & 0o777 == 0o644
    assert report.stat().st_size < 600_000
