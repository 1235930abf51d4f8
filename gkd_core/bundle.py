"""A diagnostic bundle: one archive of what someone else needs to see why a run is stuck.

The config, the event log, the logs, every stack dump and restart config, and a status page
rendered from the state at the time. Never the keys (``keys/`` holds the control socket's
secret) and never the checkpoints (gigabytes, and the model is not the question).
"""

from __future__ import annotations

import io
import tarfile
import time
from pathlib import Path

INCLUDE = ("config.yaml", "events.jsonl", "logs", "stacks", "restarts")
MAX_FILE = 256 << 20  # a runaway log is cut, not bundled whole


def write_bundle(run: Path, out: Path | None = None, status: str = "") -> Path:
    """Write ``run``'s bundle (default: RUN/bundles/bundle-<time>.tar.gz); returns its path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = out or run / "bundles" / f"bundle-{stamp}.tar.gz"
    out.parent.mkdir(parents=True, exist_ok=True)
    root = f"{run.name}-{stamp}"
    with tarfile.open(out, "w:gz") as tar:
        for name in INCLUDE:
            path = run / name
            if not path.exists():
                continue
            files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
            for f in files:
                rel = f.relative_to(run)
                if f.stat().st_size <= MAX_FILE:
                    tar.add(f, arcname=f"{root}/{rel}", recursive=False)
                else:
                    _add_text(tar, f"{root}/{rel}.tail", _tail(f, MAX_FILE))
        if status:
            _add_text(tar, f"{root}/status.txt", status.encode())
    out.chmod(0o600)  # the logs may say more than their owner wants shared by accident
    return out


def _tail(path: Path, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - n))
        return f.read()


def _add_text(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
    tar.addfile(info, io.BytesIO(data))
