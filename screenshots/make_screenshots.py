"""Regenerate the dashboard screenshots (Textual SVG, and PNG) from recorded runs:

- ``long_run.events.jsonl.gz``: the default demo for 300 steps, healthy from end to end: the healthy
  picture (no alert at its moment, or the script fails) and the plots view (p) at its end;

- ``seeds/FAULT.events.jsonl.gz``: one run of the default demo per fault of bench/bench_diagnosis.py
  (the seeds' cases: a hung sync or generation, a held GIL, a killed worker or teacher, a late
  teacher, a frozen NVML, out of memory), each shot a few seconds after it is named
  (``python bench/bench_diagnosis.py --keep screenshots/seeds`` records them again);

and two runs of examples/hang_demo.yaml (rollout/1 never finishes its weight sync at step 3):

- ``straggler_demo.events.jsonl``, with the real-world 600 s sync timeout: rollout/1 is named by its
  peer within seconds, its stack taken twice without a key press ("stuck: ... the same stack
  twice"), then D (every stack, grouped) and the run stopped;
- ``hang_demo.events.jsonl``, with a 20 s timeout: the sync runs to its timeout and the driver
  fails, naming the straggler (the tests replay this one too);
- ``memory_grower.events.jsonl.gz``: a plain Ray job under ``launch --`` in a memory cgroup of 3 GiB, one
  actor growing 40 MB a second until the kernel's OOM killer ends it (tests/ray/test_memory_oom.py's run:
  root makes the cgroup): warned with the time to the limit, then named OOM-killed, and the memory plot;
- ``pipeline_stall.events.jsonl.gz``: a plain Ray job of an async RL pipeline's shape under ``launch --``
  (tests/jobs/ray_async_pipeline.py: an inference server, a tool outside Ray, a rollouter, a message queue,
  two trainer ranks) whose tool stops answering after 20 s: the pipeline pane during the stall;
- ``verl_job.events.jsonl``: a verl job that is not ours (tests/jobs/verl_gkd_job.py, verl's own
  worker group on CPU) under ``launch --``, rank 1 never finishing ``sync_rollout_weights`` at step 3.

    python screenshots/make_screenshots.py            # from the recordings
    python screenshots/make_screenshots.py --record   # record the two demo runs again first (needs Ray)
    python screenshots/make_screenshots.py --record-verl .venv-verl/bin/python   # the verl job again
    python screenshots/make_screenshots.py --record-long   # the 300-step run again (about 3 minutes)
    python screenshots/make_screenshots.py --record-memory   # the OOM-killed job again (root; 2 minutes)
    python screenshots/make_screenshots.py --record-pipeline   # the stalled pipeline again (1 minute)

The recordings are real runs' event logs with this machine's paths replaced, so they can live in
the repository. PNGs need cairosvg (`pip install -e ".[screenshots]"`); without it only SVGs.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import html
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from gkd_core import config, rundir  # noqa: E402
from gkd_core.diagnosis import plan  # noqa: E402
from gkd_core.telemetry.control import ControlClient  # noqa: E402
from gkd_tui.app import GkdApp  # noqa: E402
from gkd_tui.screens.confirm import ConfirmScreen  # noqa: E402
from gkd_tui.screens.plots import PlotsScreen  # noqa: E402
from gkd_tui.screens.stacks import StackScreen  # noqa: E402
from gkd_tui.sources.replay import ReplaySource  # noqa: E402

HANG = HERE / "hang_demo.events.jsonl"
STRAGGLER = HERE / "straggler_demo.events.jsonl"
VERL = HERE / "verl_job.events.jsonl"
MEMORY = HERE / "memory_grower.events.jsonl.gz"
PIPELINE = HERE / "pipeline_stall.events.jsonl.gz"
PIPELINE_SHOT_S = 15.0  # after the tool's stall is named: its wait's age grown, the queue's rates at 0
LONG = HERE / "long_run.events.jsonl.gz"  # gzipped: 300 steps of events are a few MB of JSON
LONG_STEPS = 300
SEEDS = HERE / "seeds"
SEED_SHOT_S = 4.0  # after the alert that names the case: the stack taken, the verdict said
SIZE = (120, 36)


def _text(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in _text(path).splitlines() if line.strip()]


_UNPACKED: dict[Path, Path] = {}
# where they are unpacked: one folder for the whole script, removed when it exits
_UNPACK_DIR = tempfile.TemporaryDirectory(prefix="gkd-shots-")


def _replayable(path: Path) -> Path:
    """A recording as a replay reads it: a gzipped one unpacked into a file of its own, once."""
    if path.suffix != ".gz":
        return path
    if path not in _UNPACKED:
        out = Path(_UNPACK_DIR.name) / str(len(_UNPACKED)) / path.stem  # a folder each, as a run has
        out.parent.mkdir()
        out.write_text(_text(path))
        _UNPACKED[path] = out
    return _UNPACKED[path]


def _press_d(run: Path) -> None:
    """What D does: every worker's stack, into the dump named "all"."""
    with ControlClient.for_run(run, rundir.read_endpoints(run), by="screenshots") as c:
        c.request("dump_stacks", {"targets": [], "dump_id": "all"})


def _stop(run: Path) -> None:
    with ControlClient.for_run(run, rundir.read_endpoints(run), by="screenshots") as c:
        c.request("stop")


def _auto_dumps(run: Path, target: str) -> int:
    """How many stacks of ``target`` the diagnosis has taken by itself so far."""
    log = run / "events.jsonl"
    if not log.exists():
        return 0
    return sum(e["kind"] == "stack" and e["target"] == target and e["dump_id"].startswith("auto-")
               for e in _events(log))


def _fresh_home(home: Path) -> tuple[Path, dict]:
    """A GKD_HOME of its own for a recording, sharing this one's cache (the demo's models, written once)."""
    cache = Path(os.environ.get("GKD_HOME") or "~/.gkd").expanduser() / "cache"
    if cache.is_dir():
        (home / "cache").symlink_to(cache)
    return home, dict(os.environ, GKD_HOME=str(home))


def record(out: Path, timeout_s: int) -> None:
    """Run examples/hang_demo.yaml with this sync timeout. Once the diagnosis has taken rollout/1's
    stack twice, press D; with a long timeout, stop the run a few seconds later, else let it fail."""
    with tempfile.TemporaryDirectory(prefix="gkd-shots-") as tmp:
        home, env = _fresh_home(Path(tmp))
        proc = subprocess.Popen([sys.executable, "-m", "gkd_core", "run", "examples/hang_demo.yaml",
                                 f"trainer.sync_timeout_s={timeout_s}", "--run-id", "hang-demo", "--quiet"],
                                env=env, cwd=ROOT)
        run = home / "runs" / "hang-demo"
        deadline = time.monotonic() + 600
        pressed = None
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if pressed is None and _auto_dumps(run, "rollout/1") >= 2:
                _press_d(run)
                pressed = time.monotonic()
            if pressed is not None and timeout_s > 60 and time.monotonic() > pressed + 8:
                _stop(run)
                break
        proc.wait(600)
        text = (run / "events.jsonl").read_text()
    out.write_text(sanitize(text, home))


def record_long(out: Path) -> None:
    """The default demo for LONG_STEPS steps, to its end."""
    with tempfile.TemporaryDirectory(prefix="gkd-shots-") as tmp:
        home, env = _fresh_home(Path(tmp))
        subprocess.run([sys.executable, "-m", "gkd_core", "run", f"trainer.total_steps={LONG_STEPS}", "--run-id",
                        "long-run", "--quiet"], env=env, cwd=ROOT, check=True, timeout=1800)
        text = (home / "runs" / "long-run" / "events.jsonl").read_text()
    out.write_bytes(gzip.compress(sanitize(text, home).encode(), mtime=0))


def record_verl(out: Path, python: str) -> None:
    """The verl-shaped job under a run, with ``python`` (an interpreter with verl and gkd-tui): once the
    diagnosis has taken the stuck rank's stack twice, the run is stopped."""
    with tempfile.TemporaryDirectory(prefix="gkd-shots-") as tmp:
        home = Path(tmp)
        env = dict(os.environ, GKD_HOME=str(home), GLOO_SOCKET_IFNAME="lo", JOB_HANG_RANK="1", JOB_HANG_STEP="3")
        proc = subprocess.Popen([sys.executable, "-m", "gkd_core", "run", "--run-id", "verl-job", "--quiet", "--",
                                 python, "tests/jobs/verl_gkd_job.py"], env=env, cwd=ROOT)
        run = home / "runs" / "verl-job"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if _auto_dumps(run, "ActorRolloutWorker/1") >= 2:
                time.sleep(2)
                _stop(run)
                break
        proc.wait(120)
        text = (run / "events.jsonl").read_text()
    out.write_text(sanitize(text, home))


def record_pipeline(out: Path) -> None:
    """tests/jobs/ray_async_pipeline.py under a run, its tool stalled after 20 s: stopped once the stall has
    been named for PIPELINE_SHOT_S and a few seconds more."""
    with tempfile.TemporaryDirectory(prefix="gkd-shots-") as tmp:
        home, env = _fresh_home(Path(tmp))
        proc = subprocess.Popen([sys.executable, "-m", "gkd_core", "run", "--run-id", "pipeline-stall", "--quiet",
                                 "--", sys.executable, "tests/jobs/ray_async_pipeline.py", "20", "tool"],
                                env=env, cwd=ROOT)
        run = home / "runs" / "pipeline-stall"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            log = run / "events.jsonl"
            if log.exists() and any(e["kind"] == "alert" and e["code"] == "external_wait" for e in _events(log)):
                time.sleep(PIPELINE_SHOT_S + 5)
                _stop(run)
                break
        proc.wait(120)
        text = (run / "events.jsonl").read_text()
    out.write_bytes(gzip.compress(sanitize(text, home).encode(), mtime=0))


def record_memory(out: Path) -> None:
    """tests/ray/test_memory_oom.py's run (a real cgroup, the real OOM killer), its event log kept."""
    with tempfile.TemporaryDirectory(prefix="gkd-shots-") as tmp:
        subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/ray/test_memory_oom.py", "--basetemp", tmp,
                        "-p", "no:cacheprovider"], cwd=ROOT, check=True, timeout=600,
                       env=dict(os.environ, GKD_REQUIRE_CGROUP="1"))
        [log] = Path(tmp).glob("*/gkd/runs/*/events.jsonl")
        text = sanitize(log.read_text(), log.parents[2])
    # the test's cgroup, wherever this machine's hierarchy put it: a job's cgroup as a cluster names it
    text = re.sub(r"/sys/fs/cgroup/[^\"]*?gkd-test-\d+", "/sys/fs/cgroup/memory/gkd-job", text)
    out.write_bytes(gzip.compress(text.encode(), mtime=0))


def sanitize(text: str, home: Path | None = None) -> str:
    """No paths of the recording machine in the repository."""
    if home is not None:
        text = text.replace(str(home), "~/.gkd")
    text = text.replace(str(ROOT), ".").replace(sys.base_prefix, "<python>").replace(sys.prefix, "<venv>")
    return text.replace(str(Path.home()), "~")


def moments() -> list[tuple[str, Path, float, str]]:
    """(name, recording, when, overlay) of each picture."""
    hang, strag, verl, long = _events(HANG), _events(STRAGGLER), _events(VERL), _events(LONG)
    mid = next(e for e in long if e["kind"] == "metrics" and e["step"] == LONG_STEPS // 2)
    timed_out = next(e for e in hang if e["kind"] == "sync" and e["state"] == "timed_out")
    started = next(e for e in hang if e["kind"] == "sync" and e["state"] == "started"
                   and e["sync_id"] == timed_out["sync_id"])
    named = [e for e in strag if e["kind"] == "alert" and e["code"] == "straggler" and not e.get("cleared")]
    grouped = max(e["ts"] for e in strag if e["kind"] == "stack" and e["dump_id"] == "all")
    verl_stacks = [e for e in verl if e["kind"] == "stack" and e["target"] == "ActorRolloutWorker/1"]
    memory, pipeline = _events(MEMORY), _events(PIPELINE)
    tool_named = next(e for e in pipeline if e["kind"] == "alert" and e["code"] == "external_wait")
    growing = next(e for e in memory if e["kind"] == "alert" and e["code"] == "memory_growing"
                   and e["targets"] == ["Grower/0"] and e["severity"] == "critical")
    killed = next(e for e in memory if e["kind"] == "alert" and e["code"] == "oom_killed")
    return [*seed_moments(),
        ("healthy-step", LONG, mid["ts"] + 0.05, "healthy"),
        ("plots-training", LONG, long[-1]["ts"], "plots:0"),
        ("plots-sync", LONG, long[-1]["ts"], "plots:1"),
        ("plots-step-time", LONG, long[-1]["ts"], "plots:2"),
        ("plots-teacher", LONG, long[-1]["ts"], "plots:3"),
        ("straggler-stuck", STRAGGLER, named[-1]["ts"] + 0.5, ""),
        ("stack-viewer", STRAGGLER, grouped + 0.1, "stacks"),
        ("restart-diff", STRAGGLER, grouped + 0.1, "restart"),
        ("sync-near-timeout", HANG, started["ts"] + 0.85 * timed_out["timeout_s"], ""),
        ("sync-timed-out", HANG, hang[-1]["ts"], ""),
        ("verl-job-stuck", VERL, verl_stacks[min(1, len(verl_stacks) - 1)]["ts"] + 0.5, ""),
        ("memory-growing", MEMORY, growing["ts"] + 1.0, ""),
        ("memory-oom-killed", MEMORY, killed["ts"] + 0.5, ""),
        ("plots-memory", MEMORY, growing["ts"] + 15.0, "plots:5"),
        ("pipeline-tool-stalled", PIPELINE, tool_named["ts"] + PIPELINE_SHOT_S, ""),
    ]


def seed_moments() -> list[tuple[str, Path, float, str]]:
    """Each fault's recording, a few seconds after the alert of its case's own code that names the right worker."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_diagnosis import FAULTS, names

    out = []
    for name, _, target, code, *_ in FAULTS:
        recording = SEEDS / f"{name}.events.jsonl.gz"
        if not recording.exists():
            continue
        evs = _events(recording)
        # the case's own code naming the right worker: the screenshot shows the diagnosis the case is about,
        # or none is made (a recording where another alert said it is not that case's picture)
        hit = next((e for e in evs if e["kind"] == "alert" and not e.get("cleared") and e["code"] == code
                    and names(e, target)), None)
        if hit is None:
            raise SystemExit(f"{recording.name}: no {code} alert names {target}; record it again "
                             f"(`python bench/bench_diagnosis.py --keep screenshots/seeds`)")
        out.append((f"seed-{name}", recording, min(hit["ts"] + SEED_SHOT_S, evs[-1]["ts"]), ""))
    return out


def restart_diff_screen(state) -> ConfirmScreen:
    """The `r` screen at that moment, as the supervisor's dry run computes it: the plan that follows the
    active findings, each line with the finding it comes from."""
    cfg = config.load_config(ROOT / "examples" / "hang_demo.yaml", ["trainer.sync_timeout_s=600"])
    steps = plan.restart_plan(state, cfg)
    diff = "\n".join(f"  {c.key}: {c.old!r} -> {c.new!r}\n      ← {c.because}" for c in steps)
    return ConfirmScreen("Restart smaller?", f"Restart 1 from the latest checkpoint with a smaller config:\n{diff}"
                         "\n\nThe new config is written to RUN/restarts/ before the driver starts again.",
                         [("restart", "Restart smaller")])


async def shoot(recording: Path, name: str, ts: float, overlay: str = "") -> Path:
    source = ReplaySource(_replayable(recording))
    app = GkdApp(source)
    async with app.run_test(size=SIZE) as pilot:
        source.seek(ts)
        await pilot.pause()
        app.redraw()  # once the layout has settled: panes size their content to fit
        if overlay == "stacks":
            stacks = {t: r for t, r in source.state.stacks.items() if r.dump_id == "all"}
            named = frozenset(t for a in source.state.alerts.values() for t in a.targets)
            await app.push_screen(StackScreen(stacks, "all", named))  # opens on the grouped tab
        elif overlay == "restart":
            await app.push_screen(restart_diff_screen(source.state))
        elif overlay.startswith("plots:"):
            await app.push_screen(PlotsScreen(source, int(overlay.split(":")[1])))
            await pilot.pause(0.5)  # the plots are drawn once laid out
        elif overlay == "healthy":
            named = [f"{a.code} ({a.severity})" for a in source.state.alerts.values()]
            assert not named, f"the healthy picture's moment has alerts: {', '.join(named)}"
        await pilot.pause()
        svg = HERE / f"{name}.svg"
        app.save_screenshot(filename=svg.name, path=str(HERE))
    return svg


# A run of cells is one <text> with its width (textLength), which a browser keeps and cairosvg does not:
# where the font lacks a glyph (the plots' block quadrants and braille), its fallback's wider glyphs push
# the rest of the run to the right. Such runs are drawn a cell at a time for the PNG.
_RUN = re.compile(r'<text class="([^"]*)" x="([0-9.]+)" y="([0-9.]+)" textLength="([0-9.]+)"([^>]*)>([^<]*)</text>')
_DRIFTS = re.compile("[\u2580-\u259f\u2800-\u28ff]")


def _cell_by_cell(svg_text: str) -> str:
    def split(m: re.Match) -> str:
        cls, x, y, length, rest, body = m.groups()
        chars = html.unescape(body)
        if not _DRIFTS.search(chars):
            return m.group(0)
        cell = float(length) / len(chars)
        return "".join(f'<text class="{cls}" x="{float(x) + i * cell:.1f}" y="{y}" textLength="{cell:.1f}"{rest}>'
                       f"{html.escape(c)}</text>" for i, c in enumerate(chars) if c not in " \u00a0")
    return _RUN.sub(split, svg_text)


def to_png(svg: Path) -> Path | None:
    try:
        import cairosvg
    except ImportError:
        return None
    png = svg.with_suffix(".png")
    cairosvg.svg2png(bytestring=_cell_by_cell(svg.read_text()).encode(), write_to=str(png), output_width=1800)
    return png


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--record", action="store_true", help="record both runs again first")
    p.add_argument("--record-verl", metavar="PYTHON", help="record the verl job again, run by PYTHON (with verl)")
    p.add_argument("--record-long", action="store_true", help=f"record the {LONG_STEPS}-step run again")
    p.add_argument("--record-memory", action="store_true", help="record the OOM-killed job again (as root)")
    p.add_argument("--record-pipeline", action="store_true", help="record the stalled pipeline again")
    a = p.parse_args()
    if a.record_long or not LONG.exists():
        record_long(LONG)
    if a.record_memory or not MEMORY.exists():
        record_memory(MEMORY)
    if a.record_pipeline or not PIPELINE.exists():
        record_pipeline(PIPELINE)
    if a.record_verl:
        record_verl(VERL, a.record_verl)
    if a.record or not STRAGGLER.exists():
        record(STRAGGLER, 600)
    if a.record or not HANG.exists():
        record(HANG, 20)
    for name, recording, ts, overlay in moments():
        svg = asyncio.run(shoot(recording, name, ts, overlay))
        png = to_png(svg)
        print(f"{svg.relative_to(ROOT)}" + (f", {png.relative_to(ROOT)}" if png else " (no cairosvg: SVG only)"))


if __name__ == "__main__":
    main()
