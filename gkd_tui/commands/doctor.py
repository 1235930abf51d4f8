"""``gkd-tui doctor``: the preflight checks, a line each, with the fix beside a failure."""

from __future__ import annotations

import argparse
import json
import sys
import time

import msgspec

from gkd_tui.commands.launch import config_and_overrides

STATUS_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}


def cmd_doctor(a: argparse.Namespace) -> int:
    from gkd_core.doctor import run_checks

    t0 = time.monotonic()
    checks = run_checks(*config_and_overrides(a), gpu_backend=a.gpu_backend)
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
