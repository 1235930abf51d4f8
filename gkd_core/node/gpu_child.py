"""The GPU sampler's child process: answers each ``sample`` line on stdin with one JSON line.

    python -m gkd_core.node.gpu_child BACKEND PARENT_PID

A thread writes ``{"kind": "beat"}`` every second, so the parent can tell "the process is alive
but its NVML call has not returned" from "the process is gone". Replies:
``{"kind": "sample", "n": N, "gpus": [...]}``, ``{"kind": "error", "n": N, "error": "..."}`` and,
once, ``{"kind": "no_driver", "error": "..."}``.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import msgspec

from gkd_core.lifeline import die_with_parent
from gkd_core.node.gpu_backends import NoDriver, backend_from_spec

BEAT_S = 1.0
_lock = threading.Lock()
_enc = msgspec.json.Encoder()


def say(msg: dict) -> None:
    with _lock:
        sys.stdout.buffer.write(_enc.encode(msg) + b"\n")
        sys.stdout.buffer.flush()


def beat() -> None:
    while True:
        say({"kind": "beat"})
        time.sleep(BEAT_S)


def main(spec: str, parent: int | None = None) -> int:
    # the agent going away takes us along (a call stuck in the kernel stays whatever we do)
    die_with_parent(signal.SIGKILL, parent)
    threading.Thread(target=beat, name="gpu-child-beat", daemon=True).start()
    backend = backend_from_spec(spec)
    try:
        backend.open()
    except NoDriver as e:
        say({"kind": "no_driver", "error": str(e)})
        return 0
    except Exception as e:
        say({"kind": "error", "n": 0, "error": f"init: {type(e).__name__}: {e}"})
        return 1
    n = 0
    for line in sys.stdin:  # the parent closing the pipe ends us
        if line.strip() != "sample":
            continue
        n += 1
        try:
            say({"kind": "sample", "n": n, "gpus": msgspec.to_builtins(backend.read())})
        except Exception as e:
            say({"kind": "error", "n": n, "error": f"{type(e).__name__}: {e}"[:300]})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "nvml", int(sys.argv[2]) if len(sys.argv) > 2 else None))
