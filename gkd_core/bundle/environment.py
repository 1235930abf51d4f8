"""The driver's command line and the environment variables that shape a run, recorded when it starts.

The supervisor writes ``RUN/driver.json`` each time it starts (or adopts) a driver: the command, its
working directory, its python, and the variables of seed 004's checklist (NCCL_*, TORCH_*, CUDA_*,
RAY_*, VLLM_*, GKD_* and a few more) with every value that could be a secret replaced before it
touches the disk. A bug report written later, on any node and after the driver is gone, reads it.

A value is a secret when its name says so (TOKEN, SECRET, KEY, PASSWORD, AUTH, ...) or it looks like
one (a known token prefix such as ``hf_`` or ``ghp_``, a JWT, or 24 letters and digits in a row). A
redacted value is never written: only that it was set, and why it is hidden.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from gkd_core import rundir

# the variables a person helping asks for first (seed 004: "the environment variables in effect")
SHAPING_PREFIXES = ("NCCL_", "TORCH_", "PYTORCH_", "CUDA_", "RAY_", "VLLM_", "GKD_", "HF_", "TRANSFORMERS_",
                    "OMP_", "MKL_", "GLOO_", "VERL_")
SHAPING_NAMES = {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                 "PYTHONPATH", "LD_LIBRARY_PATH", "SLURM_JOB_ID", "SLURM_NNODES"}
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|_PASS$|_PWD$|_PAT$|KEY|AUTH|CREDENTIAL|CREDS|COOKIE|PRIVATE|SIGNATURE|"
                         r"_DSN$", re.IGNORECASE)
# names that say secret but hold a choice or a place, which matter to the reader: the value is still checked
NOT_SECRET = {"RAY_AUTH_MODE", "NCCL_IB_PKEY", "HF_HUB_DISABLE_IMPLICIT_TOKEN", "TOKENIZERS_PARALLELISM"}
# RAY_AUTH_TOKEN_PATH: where the token is, not the token
A_PLACE = re.compile(r"_(?:PATH|DIR|FILE|IFNAME)$", re.IGNORECASE)
# what a token looks like, wherever it is (a bundle scrubs these from every file it takes in)
TOKEN_LOOKS = [
    r"(?:hf_|sk-|sk_|ghp_|gho_|ghs_|github_pat_|glpat-|xox[abpr]-|AKIA|ASIA)[A-Za-z0-9_\-]{8,}",  # known prefixes
    r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",  # a JWT
    r"(?<=://)[^/\s:@\"']+:[^/\s@\"']+(?=@)",  # the user:password of a URL
]
# ... and in a variable's value, also a long run of letters and digits, both (a readable name's parts are
# shorter, cut by "-", "_", "/"): too common in logs (hashes, ids) to scrub there
SECRET_VALUE = re.compile("|".join([*TOKEN_LOOKS, r"(?<![A-Za-z0-9])(?=[A-Za-z0-9]*\d)(?=[A-Za-z0-9]*[A-Za-z])"
                                                  r"[A-Za-z0-9]{24,}"]))
REDACTED = "<redacted>"


class DriverRecord(msgspec.Struct, kw_only=True):
    """What ``RUN/driver.json`` says of the newest driver."""

    argv: list[str]
    cwd: str = ""
    python: str = ""  # the interpreter its versions are read with
    pid: int = 0
    started: float = 0.0
    restart: int = 0
    how: str = ""  # "our trainer", "command", "adopted"
    env: dict[str, str] = {}  # the shaping variables, secrets replaced by REDACTED
    redacted: dict[str, str] = {}  # name -> why its value is hidden

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def is_shaping(name: str) -> bool:
    return name.startswith(SHAPING_PREFIXES) or name in SHAPING_NAMES


def name_says_secret(name: str) -> bool:
    return name not in NOT_SECRET and not A_PLACE.search(name) and bool(SECRET_NAME.search(name))


def why_secret(name: str, value: str) -> str:
    """Why ``value`` is hidden, or "" when it can be shown."""
    if name_says_secret(name):
        return "its name says it is a secret"
    if SECRET_VALUE.search(value):
        return "its value looks like a token"
    return ""


def shaping_env(environ: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the shaping variables with secrets replaced, name -> why it was hidden)."""
    shown, why = {}, {}
    for name in sorted(environ):
        if not is_shaping(name):
            continue
        reason = why_secret(name, environ[name])
        shown[name] = REDACTED if reason else environ[name]
        if reason:
            why[name] = reason
    return shown, why


def secret_values(environ: Mapping[str, str]) -> set[str]:
    """Every value of ``environ`` that is or holds a secret (of any name, shaping or not): what a bundle
    scrubs from each file it takes in, in case a log printed one."""
    out = set()
    for name, value in environ.items():
        if name_says_secret(name) and len(value) >= 6:
            out.add(value)
        out.update(m.group(0) for m in SECRET_VALUE.finditer(value))
    return out


def redact_argv(argv: list[str]) -> tuple[list[str], set[str]]:
    """The command with its secrets replaced (the value of a flag whose name says secret, ``--api-key V``
    or ``--api-key=V``, and any value that looks like a token), and the secrets found."""
    out, found = [], set()
    secret_next = False
    for arg in argv:
        if secret_next and not arg.startswith("-"):
            found.add(arg)
            out.append(REDACTED)
            secret_next = False
            continue
        flag, eq, value = arg.partition("=")
        secret_next = arg.startswith("-") and not eq and name_says_secret(arg.lstrip("-").replace("-", "_"))
        if arg.startswith("-") and eq and name_says_secret(flag.lstrip("-").replace("-", "_")):
            found.add(value)
            out.append(f"{flag}={REDACTED}")
            continue
        hits = {m.group(0) for m in SECRET_VALUE.finditer(arg)}
        found |= hits
        for hit in hits:
            arg = arg.replace(hit, REDACTED)
        out.append(arg)
    return out, {f for f in found if f}


def python_of(argv: list[str]) -> str:
    """The interpreter a command runs under: its first word when that is a python, else ours."""
    if argv and re.fullmatch(r"python[\d.]*", Path(argv[0]).name):
        return shutil.which(argv[0]) or argv[0]  # resolved now: the run's PATH, not a later reader's
    return sys.executable


def record_driver(run: Path, argv: list[str], environ: Mapping[str, str], *, pid: int, restart: int, how: str,
                  cwd: str | None = None) -> DriverRecord:
    """Write ``RUN/driver.json`` (private: the command line can hold more than its owner shares)."""
    env, why = shaping_env(environ)
    shown, _ = redact_argv(list(argv))
    record = DriverRecord(argv=shown, cwd=cwd or os.getcwd(), python=python_of(argv), pid=pid,
                          started=time.time(), restart=restart, how=how, env=env, redacted=why)
    rundir.write_private_json(run / "driver.json", msgspec.to_builtins(record))
    return record


def read_driver(run: Path) -> DriverRecord | None:
    """``RUN/driver.json``, or None when the run has none (a run from before it was written) or it is
    unreadable (said by the caller as missing)."""
    try:
        return msgspec.json.decode((run / "driver.json").read_bytes(), type=DriverRecord)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def process_argv(pid: int) -> list[str]:
    """A live process's command line (its secrets are for the scrubber to know), or []."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def process_environ(pid: int) -> dict[str, str]:
    """A process's environment as it started (``/proc/PID/environ``: readable by its owner and root)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            out[name] = value
    return out
