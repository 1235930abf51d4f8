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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from gkd_core import config  # noqa: E402
from gkd_tui.app import GkdApp  # noqa: E402
from gkd_tui.screens.confirm import ConfirmScreen  # noqa: E402
from gkd_tui.screens.stacks import StackScreen  # noqa: E402
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
        proc = subprocess.Popen([sys.executable, "-m", "gkd_core", "run", "examples/hang_demo.yaml",
                                 "trainer.sync_timeout_s=20", "--run-id", "hang-demo", "--quiet"], env=env, cwd=ROOT)
        run = home / "runs" / "hang-demo"
        # halfway through the hung sync, press d as a user would: the stacks go on the record
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            log = run / "events.jsonl"
            if log.exists() and any(json.loads(line).get("state") == "progress" and json.loads(line).get(
                    "elapsed_s", 0) > 10 for line in log.read_text().splitlines() if '"sync"' in line):
                from gkd_core import rundir
                from gkd_core.telemetry.control import ControlClient

                with ControlClient.for_run(run, rundir.read_endpoints(run), by="screenshots") as c:
                    c.request("dump_stacks", {"targets": [], "dump_id": "hang"})
                break
            time.sleep(0.5)
        proc.wait(600)
        text = (run / "events.jsonl").read_text()
    out.write_text(sanitize(text, home))


def sanitize(text: str, home: Path | None = None) -> str:
    """No paths of the recording machine in the repository."""
    if home is not None:
        text = text.replace(str(home), "~/.gkd")
    text = text.replace(str(ROOT), ".").replace(sys.base_prefix, "<python>").replace(sys.prefix, "<venv>")
    return text.replace(str(Path.home()), "~")


def moments(events: list[dict]) -> dict[str, float]:
    """Timestamps worth a picture: a healthy step, the hung sync near its timeout, the end."""
    metrics = [e for e in events if e["kind"] == "metrics"]
    timed_out = next(e for e in events if e["kind"] == "sync" and e["state"] == "timed_out")
    started = next(e for e in events if e["kind"] == "sync" and e["state"] == "started"
                   and e["sync_id"] == timed_out["sync_id"])
    timeout = timed_out["timeout_s"]
    return {
        "healthy-step": (metrics[min(1, len(metrics) - 1)]["ts"] + 0.05, ""),
        "sync-near-timeout": (started["ts"] + 0.85 * timeout, ""),
        "stack-viewer": (started["ts"] + 0.9 * timeout, "stacks"),
        "sync-timed-out": (events[-1]["ts"], ""),
        "restart-diff": (events[-1]["ts"], "restart"),
    }


def restart_diff_screen() -> ConfirmScreen:
    """The `r` screen for the hang demo's config, as the supervisor's dry run computes it."""
    cfg = config.load_config(ROOT / "examples" / "hang_demo.yaml")
    small, _ = config.shrink(cfg)
    diff = "\n".join(f"  {k}: {a!r} -> {b!r}" for k, a, b in config.diff(cfg, small))
    return ConfirmScreen("Restart smaller?", f"Restart 1 from the latest checkpoint with a smaller config:\n{diff}"
                         "\n\nThe new config is written to RUN/restarts/ before the driver starts again.",
                         [("restart", "Restart smaller")])


async def shoot(recording: Path, name: str, ts: float, overlay: str = "") -> Path:
    source = ReplaySource(recording)
    app = GkdApp(source)
    async with app.run_test(size=SIZE) as pilot:
        source.seek(ts)
        await pilot.pause()
        app.redraw()  # once the layout has settled: panes size their content to fit
        if overlay == "stacks":
            stacks = {t: r for t, r in source.state.stacks.items() if r.dump_id == "hang"}
            await app.push_screen(StackScreen(stacks, "hang"))
            tabs = app.screen.query_one("#stack-tabs")
            tabs.active = next(f"stack-{i}" for i, t in enumerate(sorted(stacks)) if t == "rollout/1")
        elif overlay == "restart":
            await app.push_screen(restart_diff_screen())
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
    for name, (ts, overlay) in moments(events).items():
        svg = asyncio.run(shoot(RECORDING, name, ts, overlay))
        png = to_png(svg)
        print(f"{svg.relative_to(ROOT)}" + (f", {png.relative_to(ROOT)}" if png else " (no cairosvg: SVG only)"))


if __name__ == "__main__":
    main()
