"""``gkd-tui``: the command line (DESIGN §7). Every one-key action has a scriptable twin here.

The parser and ``main``; the commands themselves are in ``gkd_tui/commands/``. Every command that
acts on a run takes it the same way (``commands/run_arg.py``): ``RUN`` or ``--run RUN``.
"""

from __future__ import annotations

import argparse
import sys

from gkd_core.integrations.job_env import split_command
from gkd_core.supervisor import unattended_settings
from gkd_tui.commands.attach import cmd_attach, cmd_replay
from gkd_tui.commands.bundle import cmd_bundle
from gkd_tui.commands.control import (
    cmd_cancel,
    cmd_note,
    cmd_pause,
    cmd_restart,
    cmd_resume,
    cmd_status,
    cmd_stop,
)
from gkd_tui.commands.doctor import cmd_doctor
from gkd_tui.commands.launch import cmd_launch
from gkd_tui.commands.run_arg import add_run
from gkd_tui.commands.stacks import cmd_dump_stacks


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gkd-tui", description="Watch and steer GKD distillation runs.")
    # the options some commands have and the code they share reads (launch attaches through attach's
    # code; the control commands print through one function): the others get the default
    p.set_defaults(ray_address=None, plain=False, readonly=False, json=False)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    s = sub.add_parser("launch", help="start a run detached (no config: the tiny CPU demo) and attach; "
                                      "`launch -- COMMAND ...`: any trainer (verl, a Ray script) as the run's driver",
                       usage="%(prog)s [CONFIG] [KEY=VALUE ...] [--detach] [-- COMMAND ...]")
    s.add_argument("config", nargs="?", help="a YAML config; omit for the embedded tiny CPU demo")
    s.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    s.add_argument("--detach", action="store_true", help="start it and return, without attaching")
    s.add_argument("--linger", type=float, default=3600.0, metavar="S",
                   help="keep the supervisor up S seconds after the run ends, for a restart (default 3600)")
    unattended_settings.add_arguments(s)
    s.set_defaults(func=cmd_launch)

    s = sub.add_parser("attach", help="the dashboard of a run (default: the latest run on this machine)")
    add_run(s)
    s.add_argument("--plain", action="store_true", help="a line per event instead of the dashboard")
    s.add_argument("--readonly", action="store_true", help="no cancel or restart from this dashboard")
    s.add_argument("--ray-address", metavar="ADDR", default=None,
                   help="any Ray job, through the Ray state API alone: 'auto' on a node of the cluster, or "
                        "the dashboard's http://HOST:8265 (the token must be at hand)")
    s.set_defaults(func=cmd_attach)

    s = sub.add_parser("replay", help="replay a recorded run in the dashboard (space, →, End, +/-)")
    add_run(s, help="a run directory or its events.jsonl (default: the latest run on this machine)")
    s.add_argument("--speed", type=float, default=None, help="replay speed (default 1x)")
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser("status", help="print a run's state from a snapshot")
    add_run(s)
    s.add_argument("--json", action="store_true", help="the snapshot as JSON")
    s.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for the supervisor")
    s.set_defaults(func=cmd_status)

    s = sub.add_parser("stop", help="stop a run (the driver gets SIGTERM, then SIGKILL)")
    add_run(s)
    s.add_argument("--grace", type=float, default=None, help="seconds between SIGTERM and SIGKILL")
    s.set_defaults(func=cmd_stop)

    s = sub.add_parser("restart", help="restart the driver from the latest checkpoint")
    add_run(s)
    s.add_argument("--smaller", action="store_true",
                   help="the changes the active diagnosis calls for (out of memory: the memory ladder; a straggler: "
                        "one rollout worker fewer), else the config's shrink rules")
    s.add_argument("--dry-run", action="store_true", help="show the config changes only")
    s.add_argument("--grace", type=float, default=None,
                   help="seconds the old driver has between SIGTERM and SIGKILL (default: the run's)")
    s.add_argument("-o", "--override", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_restart)

    s = sub.add_parser("cancel", help="cancel a worker's task, the current sync, or everything")
    s.add_argument("target", nargs="?", metavar="TARGET",
                   help="what to cancel: a worker (rollout/1), 'sync' or 'all' (default: sync); the run is --run")
    add_run(s, positional=False)
    s.add_argument("--force", action="store_true", help="kill the worker if it does not stop")
    s.set_defaults(func=cmd_cancel)

    s = sub.add_parser("pause", help="hold the driver at the end of the step under way (its workers idle, the run "
                                     "kept) until `gkd-tui resume`, or --for seconds")
    add_run(s)
    s.add_argument("--for", dest="for_s", type=float, default=None, metavar="SECONDS",
                   help="the pause ends by itself after this long (default: an hour)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_pause)

    s = sub.add_parser("resume", help="a paused driver goes on (a pause asked for and not begun is called off)")
    add_run(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_resume)

    s = sub.add_parser("note", help="put a note on the run's record (what you tried, what you saw): the bug report "
                                    "lists it among what was tried")
    s.add_argument("text", nargs="+", help="the note's words")
    add_run(s, positional=False)
    s.set_defaults(func=cmd_note)

    s = sub.add_parser("doctor", help="preflight: Python, torch, CUDA/NCCL, GPUs, environment, Ray, config")
    s.add_argument("config", nargs="?", help="a YAML config to check (default: the embedded demo)")
    s.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    s.add_argument("--json", action="store_true")
    s.add_argument("--gpu-backend", default="nvml", help=argparse.SUPPRESS)  # the test backend, for tests
    s.set_defaults(func=cmd_doctor)

    s = sub.add_parser("bundle", help="a bug report in one archive: summary.md, stacks taken for it, versions, "
                                      "command, environment, Ray's view, logs (never keys or tokens)")
    add_run(s)
    s.add_argument("-o", "--output", help="the archive's path (default: RUN/bundles/bundle-TIME.tar.gz)")
    s.add_argument("--stacks-timeout", type=float, default=20.0,
                   help="seconds to wait for every worker's stacks (default 20)")
    s.add_argument("--no-stacks", action="store_true", help="take no stacks for it (those taken before go in)")
    s.add_argument("--live-taken", metavar="FILE",
                   help="make FILE once the stacks and Ray's view are taken, then write the archive at a low "
                        "priority (what a restart must wait for, and what it need not: the recovery's)")
    s.set_defaults(func=cmd_bundle)

    s = sub.add_parser("dump-stacks", help="capture the stacks of workers (default: all)")
    s.add_argument("targets", nargs="*", metavar="TARGET",
                   help="the workers whose stacks to take (default: every worker); the run is --run")
    add_run(s, positional=False)
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
