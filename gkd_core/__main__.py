"""``python -m gkd_core run CONFIG.yaml [key=value …] [-- COMMAND …]``: the supervisor in the foreground.

With ``-- COMMAND``, that command is the run's driver (verl, OpenRLHF, a plain Ray script): its
processes report through the run's environment (gkd_core/integrations); the config's telemetry and
agent settings apply.

For batch schedulers: it exits when the run ends, with the run's exit status (0 finished; the
driver's code, or 128+signal, when it failed; 143 when it was stopped on request).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gkd_core import rundir
from gkd_core.config import ConfigError, load_config
from gkd_core.integrations.job_env import split_command
from gkd_core.supervisor import unattended_settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gkd_core", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run the supervisor (and its driver) in the foreground")
    run.add_argument("config", nargs="?", help="a YAML config; omit for the embedded tiny CPU demo")
    run.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. trainer.total_steps=10")
    run.add_argument("--run-id", help="name of the run directory under $GKD_HOME/runs (default: a timestamp)")
    run.add_argument("--linger", type=float, default=0.0, metavar="S",
                     help="keep serving for S seconds after the run ends (for a restart from the dashboard)")
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="take over a run whose supervisor is gone: its latest config, its log, and its driver "
                          "started again from the latest checkpoint (what `gkd-tui restart` does then)")
    run.add_argument("--adopt", type=int, metavar="PID", default=None,
                     help="watch a job its user started (pid PID) instead of starting a driver: what a job that "
                          "asked for a run of its own (GKD_WATCH=1) starts")
    run.add_argument("--ray-address", default="", metavar="ADDRESS",
                     help="look at the jobs of the Ray cluster at ADDRESS ('auto': this machine's) through its state "
                          "API instead of starting a driver: what `gkd-tui attach --ray-address` starts")
    run.add_argument("--driver", default=None, help=argparse.SUPPRESS)
    run.add_argument("--quiet", action="store_true", help="print nothing but errors")
    unattended_settings.add_arguments(run)
    return p


def main(argv: list[str] | None = None) -> int:
    ours, command = split_command(list(sys.argv[1:] if argv is None else argv))
    args = _parser().parse_args(ours)
    cfg_path, overrides = args.config, list(args.overrides)
    resume = None
    if args.resume:
        resume = Path(args.resume).resolve()
        if cfg_path:
            overrides.insert(0, cfg_path)  # on a taken-over run, key=value overrides only
        try:
            cfg_path = str(rundir.latest_config(resume))
            rundir.check_unsupervised(resume)
        except (OSError, RuntimeError) as e:
            print(f"gkd: cannot take over {resume}: {e}", file=sys.stderr)
            return 2
        try:  # the driver the run had (a test's demo driver, say), unless told otherwise
            old = json.loads((resume / "endpoints.json").read_bytes())
            args.driver = args.driver or (old.get("driver_module") if isinstance(old, dict) else None)
            command = command or (list(old.get("command") or []) if isinstance(old, dict) else []) or None
            adopted = old.get("adopted") if isinstance(old, dict) else None
            args.ray_address = args.ray_address or (str(old.get("ray_address") or "") if isinstance(old, dict) else "")
        except (OSError, ValueError):
            adopted = None
        if adopted and not command:
            print(f"gkd: cannot take over {resume}: it watched a job its user started (pid {adopted}), which gkd "
                  "cannot start again; start the job again as you did (with GKD_WATCH=1 it is a new run)",
                  file=sys.stderr)
            return 2
    if cfg_path and "=" in cfg_path and not Path(cfg_path).exists():
        overrides.insert(0, cfg_path)  # `run trainer.total_steps=5`: overrides on the embedded default
        cfg_path = None
    if command == []:
        print("gkd: nothing after `--`: give the command to run, e.g. `-- python train.py`", file=sys.stderr)
        return 2
    try:
        cfg = load_config(cfg_path, overrides)
    except ConfigError as e:
        print(f"gkd: invalid config: {e}", file=sys.stderr)
        return 2
    try:  # what `launch` handed over, else this command line's over the user's own settings file
        told = unattended_settings.from_env() or unattended_settings.settings(
            rundir.gkd_home(), args.notify, args.notify_command, args.metrics_port, args.metrics_host,
            args.restart_on, args.restart_grace, args.restart_budget)
    except ValueError as e:
        print(f"gkd: invalid unattended settings: {e}", file=sys.stderr)
        return 2
    from gkd_core.diagnosis.headline import headline
    from gkd_core.supervisor.supervisor import DEFAULT_DRIVER, Supervisor
    from gkd_core.trainer import checkpoints

    sup = Supervisor(cfg, config_source=cfg_path or "the embedded default", run_id=args.run_id,
                     driver_module=args.driver or DEFAULT_DRIVER, linger_s=args.linger, resume=resume,
                     command=command or None, adopt=args.adopt, ray_address=args.ray_address,
                     unattended=told or None)
    if not args.quiet:
        print(f"gkd: run {sup.run_id} in {sup.run_dir}", file=sys.stderr)
        print("gkd: watch it with `gkd-tui attach`; stop it with `gkd-tui stop`", file=sys.stderr)
        if sup.unattended is not None and sup.unattended.metrics_address:
            print(f"gkd: metrics for Prometheus at {sup.unattended.metrics_address}", file=sys.stderr)
    t0 = time.monotonic()
    status = sup.serve()
    if not args.quiet:
        print(f"gkd: run {sup.run_id} {sup.state.state} (exit status {status}) in {time.monotonic() - t0:.0f} s"
              + summary(sup.state), file=sys.stderr)
        if sup.state.state == "failed" and sup.state.log_tail:
            print(f"gkd: {headline(sup.state.log_tail).removeprefix('gkd driver: ')}", file=sys.stderr)
        final = checkpoints.latest(sup.run_dir / "checkpoints")
        if final is not None:
            print(f"gkd: the student is in {final} (a Hugging Face folder: from_pretrained loads it)",
                  file=sys.stderr)
    return status


def summary(state) -> str:
    """`; step 60/60, agreement 20.8% -> 71.4%, KL 2.74 -> 0.83` when the run reported metrics."""
    ms = [m for m in state.metrics if m.agreement is not None]
    if not ms:
        return ""
    first, last = state.first_metrics or ms[0], ms[-1]
    if first.agreement is None:
        first = ms[0]
    out = f"; step {last.step}/{state.total_steps or '?'}, agreement {100 * first.agreement:.1f}% -> " \
          f"{100 * last.agreement:.1f}%"
    # the evaluations' KL when the run evaluated (as its agreement is), else the samples'
    kl0 = first.eval_kl if first.eval_kl is not None else first.kl
    kl1 = last.eval_kl if last.eval_kl is not None else last.kl
    if kl0 is not None and kl1 is not None:
        out += f", KL {kl0:.2f} -> {kl1:.2f}"
    return out


if __name__ == "__main__":
    sys.exit(main())
