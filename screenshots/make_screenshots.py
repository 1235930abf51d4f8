"""Regenerate the dashboard screenshots (Textual SVG, and PNG) from a recorded hang_demo run.

    python screenshots/make_screenshots.py            # from screenshots/hang_demo.events.jsonl
    python screenshots/make_screenshots.py --record   # record a new hang_demo run first (needs Ray)

The recording is a real run's event log with this machine's paths replaced, so it can live in
the repository. PNGs need cairosvg (`pip install cairosvg`); without it only SVGs are written.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from gkd_tui.app import GkdApp  # noqa: E402
from gkd_tui.sources.replay import ReplaySource  # noqa: E402

RECORDING = HERE / "hang_demo.events.jsonl"
SIZE = (120, 36)


def record(out: Path) -> None:
    """Run examples/hang_demo.yaml until its sync times out and keep the log, sanitized."""
    with tempfile.TemporaryDirectory(prefix="gkd-shots-") as tmp:
        home = Path(tmp)
        env = dict(os.environ, GKD_HOME=str(home))
        cache = Path(os.environ.get("GKD_HOME") or "~/.gkd").expanduser() / "cache"
        if cache.is_dir():
            (home / "cache").symlink_to(cache)
        subprocess.run([sys.executable, "-m", "gkd_core", "run", "examples/hang_demo.yaml",
                        "trainer.sync_timeout_s=20", "--run-id", "hang-demo", "--quiet"], env=env, cwd=ROOT,
                       timeout=900)
        text = (home / "runs" / "hang-demo" / "events.jsonl").read_text()
    # no paths of the recording machine in the repository
    text = text.replace(str(home), "~/.gkd").replace(str(ROOT), ".")
    text = re.sub(r'(?<=")/[^"]*?/site-packages/', "<site-packages>/", text)
    out.write_text(text)


def moments(events: list[dict]) -> dict[str, float]:
    """Timestamps worth a picture: a healthy step, the hung sync near its timeout, the end."""
    metrics = [e for e in events if e["kind"] == "metrics"]
    timed_out = next(e for e in events if e["kind"] == "sync" and e["state"] == "timed_out")
    started = next(e for e in events if e["kind"] == "sync" and e["state"] == "started"
                   and e["sync_id"] == timed_out["sync_id"])
    timeout = timed_out["timeout_s"]
    return {
        "healthy-step": metrics[min(1, len(metrics) - 1)]["ts"] + 0.05,
        "sync-near-timeout": started["ts"] + 0.85 * timeout,
        "sync-timed-out": events[-1]["ts"],
    }


async def shoot(recording: Path, name: str, ts: float) -> Path:
    source = ReplaySource(recording)
    app = GkdApp(source)
    async with app.run_test(size=SIZE) as pilot:
        source.seek(ts)
        app.redraw()
        await pilot.pause()
        svg = HERE / f"{name}.svg"
        app.save_screenshot(filename=svg.name, path=str(HERE))
    return svg


def to_png(svg: Path) -> Path | None:
    try:
        import cairosvg
    except ImportError:
        return None
    png = svg.with_suffix(".png")
    cairosvg.svg2png(url=str(svg), write_to=str(png), output_width=1800)
    return png


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--record", action="store_true", help="record a new hang_demo run first")
    a = p.parse_args()
    if a.record or not RECORDING.exists():
        record(RECORDING)
    events = [json.loads(line) for line in RECORDING.read_text().splitlines() if line.strip()]
    for name, ts in moments(events).items():
        svg = asyncio.run(shoot(RECORDING, name, ts))
        png = to_png(svg)
        print(f"{svg.relative_to(ROOT)}" + (f", {png.relative_to(ROOT)}" if png else " (no cairosvg: SVG only)"))


if __name__ == "__main__":
    main()
