"""``gkd-tui``: the command line (DESIGN §7). Every one-key action has a scriptable twin here."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from gkd_core import rundir
from gkd_core.config import ConfigError, load_config
from gkd_core.integrations.job_env import split_command
from gkd_core.state import RunState
from gkd_core.telemetry.control import ControlClient, ControlError, ControlUnreachable
from gkd_tui.render_text import status_text

EXIT_UNREACHABLE = 3
LAUNCH_WAIT_S = 30.0


def _client(run: Path, timeout_s: float = 2.0) -> tuple[ControlClient, dict]:
    endpoints = rundir.read_endpoints(run)
    if rundir.supervisor_pid(run) and not rundir.supervisor_alive(run):
        # no need to wait out the timeout for an answer that cannot come
        raise ControlUnreachable(f"its supervisor (pid {endpoints.get('supervisor_pid', '?')}) is not running")
    return ControlClient.for_run(run, endpoints, timeout_s=timeout_s, by=f"{os.environ.get('USER', 'cli')}/cli"), endpoints


def _unreachable(run: Path | None, err: Exception) -> int:
    where = f" (run directory {run})" if run else ""
    print(f"gkd-tui: no run reachable{where}: {err}", file=sys.stderr)
    if run is not None and (run / "events.jsonl").exists():
        print(f"gkd-tui: its event log is still there: `gkd-tui replay {run}`", file=sys.stderr)
        if rundir.supervisor_pid(run) and not rundir.supervisor_alive(run):
            print(f"gkd-tui: its supervisor (pid {rundir.supervisor_pid(run) or '?'}) is gone: `gkd-tui restart "
                  f"{run}` takes the run over and resumes it from its latest checkpoint", file=sys.stderr)
    return EXIT_UNREACHABLE


def cmd_status(a: argparse.Namespace) -> int:
    run = None
    try:
        run = rundir.resolve_run(a.run)
        client, _ = _client(run, a.timeout)
        with client:
            snap = client.request("snapshot")
    except (rundir.RunNotFound, ControlUnreachable, ControlError) as e:
        return _unreachable(run, e)
    now = time.time()
    if a.json:
        state = msgspec.convert(snap["state"], RunState)
        view = state.sync_view(now)
        out = {"run_dir": str(run), "seq": snap["seq"], "now": now, "supervisor": snap.get("supervisor", {}),
               "sync_view": msgspec.to_builtins(view) if view else None, "state": snap["state"]}
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(status_text(msgspec.convert(snap["state"], RunState), now, run))
    return 0


def _act(a: argparse.Namespace, op: str, args: dict, timeout_s: float = 5.0) -> int:
    run = None
    try:
        run = rundir.resolve_run(a.run)
        client, _ = _client(run, timeout_s)
        with client:
            result = client.request(op, args)
    except ControlError as e:
        print(f"gkd-tui: {op} refused: {e}", file=sys.stderr)
        return 1
    except (rundir.RunNotFound, ControlUnreachable) as e:
        return _unreachable(run, e)
    print(json.dumps(result, indent=1) if getattr(a, "json", False) else _describe(op, result))
    return 0


def _describe(op: str, result) -> str:
    if op == "restart" and isinstance(result, dict):
        lines = [f"restart {result.get('restart')}: {result.get('config', '(dry run)')}"]
        for key, old, new, *why in result.get("changes", []):
            lines.append(f"  {key}: {old!r} -> {new!r}" + (f"    ({why[0]})" if why and why[0] else ""))
        if not result.get("changes"):
            lines.append("  (same config)")
        return "\n".join(lines)
    if op == "stop" and isinstance(result, dict):
        pid = result.get("driver_pid")
        who = f"the driver (pid {pid}) gets SIGTERM, then SIGKILL if it lingers" if pid else "no driver is running"
        return f"stopping: {who}; the supervisor ends after it (`gkd-tui replay` shows the run afterwards)"
    return f"{op}: {json.dumps(result)}"


def cmd_stop(a: argparse.Namespace) -> int:
    return _act(a, "stop", {"grace_s": a.grace} if a.grace is not None else {})


def cmd_restart(a: argparse.Namespace) -> int:
    try:
        run = rundir.resolve_run(a.run)
    except rundir.RunNotFound as e:
        return _unreachable(None, e)
    if rundir.supervisor_pid(run) and not rundir.supervisor_alive(run) and (run / "events.jsonl").exists():
        return _take_over(run, a)
    return _act(a, "restart", {"shrink": a.smaller, "overrides": a.overrides, "dry_run": a.dry_run})


def _take_over(run: Path, a: argparse.Namespace) -> int:
    """The run's supervisor is gone (killed, its node rebooted): a new one, detached, takes the run
    over. It continues the log and restarts the driver from the latest checkpoint."""
    if a.smaller or a.dry_run:
        print(f"gkd-tui: restart: the supervisor of {run} is gone, and --smaller and --dry-run need it (they "
              "read its diagnosis); restart without them, or with -o KEY=VALUE", file=sys.stderr)
        return 2
    old = rundir.supervisor_pid(run)
    argv = [sys.executable, "-m", "gkd_core", "run", *a.overrides, "--resume", str(run), "--linger", "3600",
            "--quiet"]
    out = open(run / "logs" / "supervisor.log", "ab")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out.close()
    deadline = time.monotonic() + LAUNCH_WAIT_S
    while rundir.supervisor_pid(run) in (old, 0):
        if proc.poll() is not None or time.monotonic() > deadline:
            print(f"gkd-tui: restart: a new supervisor for {run} did not start within {LAUNCH_WAIT_S:g} s; its "
                  f"output is in {run / 'logs' / 'supervisor.log'}", file=sys.stderr)
            return 1
        time.sleep(0.05)
    print(f"gkd-tui: the supervisor of {run.name} (pid {old or '?'}) was gone; supervisor pid {proc.pid} took the "
          "run over and restarts its driver from the latest checkpoint", file=sys.stderr)
    return 0


def cmd_cancel(a: argparse.Namespace) -> int:
    return _act(a, "cancel", {"target": a.target, "mode": "force" if a.force else "cooperative"})


def cmd_dump_stacks(a: argparse.Namespace) -> int:
    """Ask for the stacks, wait (bounded) until the driver has answered, print them grouped: identical
    stacks together, the odd ones out first. Exit 1 when some could not be taken."""
    from gkd_core.stack_text import group, grouped_report

    run = None
    asked_at = time.time()
    dump_id = f"cli-{os.getpid()}-{int(asked_at * 1000)}"
    try:
        run = rundir.resolve_run(a.run)
        client, _ = _client(run, 5.0)
        with client:
            client.request("dump_stacks", {"targets": a.targets, "dump_id": dump_id})
            state, answered = _wait_for_dump(client, dump_id, a.timeout)
    except ControlError as e:
        print(f"gkd-tui: dump-stacks refused: {e}", file=sys.stderr)
        return 1
    except (rundir.RunNotFound, ControlUnreachable) as e:
        return _unreachable(run, e)
    # the state keeps a worker's newest stack: one the diagnosis took after we asked (its automatic
    # dump can land between ours and our read) is as good an answer
    records = {t: r for t, r in state.stacks_prev.items() if r.dump_id == dump_id}
    records.update({t: r for t, r in state.stacks.items()
                    if r.dump_id == dump_id or (r.ts >= asked_at and r.text and t in (answered.get("targets") or [])
                                                and t not in records)})
    wanted = answered.get("targets") or a.targets or sorted(records)
    taken = {t: r.text for t, r in records.items() if r.text}
    missing = {t: (records[t].error if t in records else f"no answer within {a.timeout:g} s") for t in wanted
               if t not in taken}
    notes = {t: r.error for t, r in records.items() if r.text and r.error}
    named = {t for alert in state.alerts.values() for t in alert.targets}
    groups = group(taken, named)
    if a.json:
        json.dump({"dump_id": dump_id, "folder": answered.get("folder", ""), "named": sorted(named),
                   "groups": [{"targets": g.targets, "where": g.where, "stack": g.text} for g in groups],
                   "missing": missing, "notes": notes}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(f"stacks of {len(wanted)} worker(s), dump {dump_id}"
              + (f", saved in RUN/{answered['folder']}" if answered.get("folder") else ""))
        print(grouped_report(taken, named, {**notes, **missing}))
    return 1 if missing else 0


def _wait_for_dump(client: ControlClient, dump_id: str, timeout_s: float) -> tuple[RunState, dict]:
    """The state once the driver's `dump_stacks` action for this dump is on record, or at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = msgspec.convert(client.request("snapshot")["state"], RunState)
        answer = state.dump_answer(dump_id)
        if answer is not None:
            return state, answer
        if time.monotonic() > deadline:
            return state, {}
        time.sleep(0.25)


def _config_and_overrides(a: argparse.Namespace) -> tuple[str | None, list[str]]:
    """`launch trainer.total_steps=5` has no config file: its first word is an override."""
    cfg_path, overrides = a.config, list(a.overrides)
    if cfg_path and "=" in cfg_path and not Path(cfg_path).exists():
        overrides.insert(0, cfg_path)
        cfg_path = None
    return cfg_path, overrides


def cmd_launch(a: argparse.Namespace) -> int:
    cfg_path, overrides = _config_and_overrides(a)
    try:
        load_config(cfg_path, overrides)  # refuse a bad config here, before anything starts
    except ConfigError as e:
        print(f"gkd-tui: invalid config: {e}", file=sys.stderr)
        return 2
    run_id = rundir.new_run_id()
    home = rundir.gkd_home()
    home.mkdir(parents=True, exist_ok=True)
    command = getattr(a, "command", [])
    argv = [sys.executable, "-m", "gkd_core", "run", *([cfg_path] if cfg_path else []), *overrides,
            "--run-id", run_id, "--linger", str(a.linger), "--quiet", *(["--", *command] if command else [])]
    out = open(home / f"supervisor-{run_id}.log", "ab")
    # its own session, like tmux: closing the dashboard or the SSH session does not stop training
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out.close()
    run = rundir.runs_root(home) / run_id
    deadline = time.monotonic() + LAUNCH_WAIT_S
    while not (run / "endpoints.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            print(f"gkd-tui: the supervisor did not start within {LAUNCH_WAIT_S:g} s; its output is in "
                  f"{home / f'supervisor-{run_id}.log'}", file=sys.stderr)
            return 1
        time.sleep(0.05)
    print(f"gkd-tui: launched run {run_id} (supervisor pid {proc.pid}) in {run}", file=sys.stderr)
    if a.detach:
        return 0
    a.target = str(run)
    return cmd_attach(a)


def cmd_attach_ray(a: argparse.Namespace) -> int:
    """Any Ray job through the state API: the dashboard, or (--plain, or no TTY) one snapshot."""
    from gkd_tui.sources.ray_state import RayStateSource

    source = RayStateSource(a.ray_address)
    if a.plain or not sys.stdout.isatty():
        source.start_once()
        with source.lock:
            print(status_text(source.state, time.time()))
        return EXIT_UNREACHABLE if source.error else 0
    from gkd_tui.app import GkdApp

    GkdApp(source, readonly=True).run()
    return 0


def cmd_attach(a: argparse.Namespace) -> int:
    if getattr(a, "ray_address", None):  # launch attaches through here too, without the option
        return cmd_attach_ray(a)
    run = None
    try:
        run = rundir.resolve_run(a.target)
        if getattr(a, "plain", False) or not sys.stdout.isatty():
            from gkd_tui.follow import follow

            return follow(run)
        from gkd_tui.app import GkdApp
        from gkd_tui.sources.live import LiveSource

        GkdApp(LiveSource(run), readonly=getattr(a, "readonly", False)).run()
        print(f"gkd-tui: detached from {run.name}; the run goes on (`gkd-tui attach` to come back)", file=sys.stderr)
        return 0
    except (rundir.RunNotFound, ControlUnreachable) as e:
        return _unreachable(run, e)


def cmd_replay(a: argparse.Namespace) -> int:
    from gkd_tui.app import GkdApp
    from gkd_tui.sources.replay import ReplaySource, skipped_note

    path = Path(a.target).expanduser()
    if path.is_dir():
        path = path / "events.jsonl"
    if not path.is_file():
        print(f"gkd-tui: no event log at {path} (give a run directory or its events.jsonl)", file=sys.stderr)
        return 2
    source = ReplaySource(path)
    if source.skipped and not source.events and not source.state.workers:
        # not one line of what was read is an event: another file, not a run's log
        print(f"gkd-tui: no events in {skipped_note(path, source.skipped)}; give a run directory or its "
              "events.jsonl", file=sys.stderr)
        return 2
    if source.warning():  # before the dashboard takes the screen: still there when it quits
        print(f"gkd-tui: warning: {source.warning()}", file=sys.stderr)
    if a.speed:
        source.speed = a.speed
    GkdApp(source).run()
    return 0


def cmd_bundle(a: argparse.Namespace) -> int:
    from gkd_core.bundle import write_bundle

    try:
        run = rundir.resolve_run(a.run)
    except rundir.RunNotFound as e:
        print(f"gkd-tui: {e}", file=sys.stderr)
        return 2
    status = ""
    try:  # the live state when the supervisor answers; else the state the event log leads to
        client, _ = _client(run, 2.0)
        with client:
            snap = client.request("snapshot")
        status = status_text(msgspec.convert(snap["state"], RunState), time.time(), run)
    except (rundir.RunNotFound, ControlUnreachable, ControlError) as e:
        status = f"(no live state: {e})\n" + _status_from_log(run)
    out = write_bundle(run, Path(a.output) if a.output else None, status)
    print(out)
    return 0


def _status_from_log(run: Path) -> str:
    """The status page of the state ``RUN/events.jsonl`` leads to, at its last event; lines that are
    no event are skipped and said, here and on stderr (a torn last line, after a crash)."""
    from gkd_core.runlog.reader import replay, skipped_note

    path = run / "events.jsonl"
    if not path.is_file():
        return f"(no event log at {path})"
    skipped: list[tuple[int, str]] = []
    state = replay(path, skipped)  # a chunk at a time: a day's log need not fit in memory twice
    head = f"from the event log ({state.applied} events"
    if skipped:
        note = skipped_note(path, skipped)
        print(f"gkd-tui: warning: {note}", file=sys.stderr)
        head += f"; {note}"
    return f"{head}):\n{status_text(state, state.last_ts, run)}"


STATUS_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}


def cmd_doctor(a: argparse.Namespace) -> int:
    from gkd_core.doctor import run_checks

    t0 = time.monotonic()
    checks = run_checks(*_config_and_overrides(a), gpu_backend=a.gpu_backend)
    if a.json:
        json.dump(msgspec.to_builtins(checks), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            print(f"{STATUS_MARK[c.status]}  {c.name:<{width}}  {c.detail}")
            if c.fix:
                print(f"      {'':<{width}}  -> {c.fix}")
        counts = {k: sum(c.status == k for c in checks) for k in STATUS_MARK}
        print(f"\n{counts['pass']} passed, {counts['warn']} warnings, {counts['fail']} failed "
              f"in {time.monotonic() - t0:.1f} s")
    return 1 if any(c.status == "fail" for c in checks) else 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gkd-tui", description="Watch and steer GKD distillation runs.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    s = sub.add_parser("launch", help="start a run detached (no config: the tiny CPU demo) and attach; "
                                      "`launch -- COMMAND ...`: any trainer (verl, a Ray script) as the run's driver",
                       usage="%(prog)s [CONFIG] [KEY=VALUE ...] [--detach] [-- COMMAND ...]")
    s.add_argument("config", nargs="?", help="a YAML config; omit for the embedded tiny CPU demo")
    s.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    s.add_argument("--detach", action="store_true", help="start it and return, without attaching")
    s.add_argument("--linger", type=float, default=3600.0, metavar="S",
                   help="keep the supervisor up S seconds after the run ends, for a restart (default 3600)")
    s.set_defaults(func=cmd_launch)

    s = sub.add_parser("attach", help="the dashboard of a run (default: the latest run on this machine)")
    s.add_argument("target", nargs="?", help="a run directory or run id")
    s.add_argument("--plain", action="store_true", help="a line per event instead of the dashboard")
    s.add_argument("--readonly", action="store_true", help="no cancel or restart from this dashboard")
    s.add_argument("--ray-address", metavar="ADDR", default=None,
                   help="any Ray job, through the Ray state API alone: 'auto' on a node of the cluster, or "
                        "the dashboard's http://HOST:8265 (the token must be at hand)")
    s.set_defaults(func=cmd_attach)

    s = sub.add_parser("replay", help="replay a recorded run in the dashboard (space, →, End, +/-)")
    s.add_argument("target", help="a run directory or its events.jsonl")
    s.add_argument("--speed", type=float, default=None, help="replay speed (default 1x)")
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser("status", help="print a run's state from a snapshot")
    s.add_argument("run", nargs="?", help="a run directory or run id (default: the latest)")
    s.add_argument("--json", action="store_true", help="the snapshot as JSON")
    s.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the supervisor")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("stop", help="stop a run (the driver gets SIGTERM, then SIGKILL)")
    s.add_argument("run", nargs="?")
    s.add_argument("--grace", type=float, default=None, help="seconds between SIGTERM and SIGKILL")
    s.set_defaults(func=cmd_stop)

    s = sub.add_parser("restart", help="restart the driver from the latest checkpoint")
    s.add_argument("run", nargs="?")
    s.add_argument("--smaller", action="store_true", help="the changes the active diagnosis calls for (out of memory: the memory ladder; a straggler: one rollout worker fewer), else the config's shrink rules")
    s.add_argument("--dry-run", action="store_true", help="show the config changes only")
    s.add_argument("-o", "--override", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_restart)

    s = sub.add_parser("cancel", help="cancel a worker's task, the current sync, or everything")
    s.add_argument("target", nargs="?", default="sync", help="a worker (rollout/1), 'sync' or 'all'")
    s.add_argument("--run", default=None)
    s.add_argument("--force", action="store_true", help="kill the worker if it does not stop")
    s.set_defaults(func=cmd_cancel)

    s = sub.add_parser("doctor", help="preflight: Python, torch, CUDA/NCCL, GPUs, environment, Ray, config")
    s.add_argument("config", nargs="?", help="a YAML config to check (default: the embedded demo)")
    s.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    s.add_argument("--json", action="store_true")
    s.add_argument("--gpu-backend", default="nvml", help=argparse.SUPPRESS)  # the test backend, for tests
    s.set_defaults(func=cmd_doctor)

    s = sub.add_parser("bundle", help="one archive to share: config, events, logs, stacks (never keys)")
    s.add_argument("run", nargs="?", help="a run directory or run id (default: the latest)")
    s.add_argument("-o", "--output", help="the archive's path (default: RUN/bundles/bundle-TIME.tar.gz)")
    s.set_defaults(func=cmd_bundle)

    s = sub.add_parser("dump-stacks", help="capture the stacks of workers (default: all)")
    s.add_argument("targets", nargs="*")
    s.add_argument("--run", default=None)
    s.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the stacks (default 10)")
    s.add_argument("--json", action="store_true", help="the groups, the missing and the notes as JSON")
    s.set_defaults(func=cmd_dump_stacks)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] | None = None
    if argv[:1] == ["launch"]:
        argv, command = split_command(argv)
        if command == []:
            print("gkd-tui: launch: nothing after `--`: give the command to run, e.g. "
                  "`gkd-tui launch -- python train.py`", file=sys.stderr)
            return 2
    a = _parser().parse_args(argv)
    a.command = command or []
    try:
        return a.func(a)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gkd-tui status --json | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
