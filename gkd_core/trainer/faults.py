"""The injected faults of a run (``faults:`` in the config), typed, and who fires which.

The driver holds the plan and fires its own (the teacher's, the disk's, NVML's); each worker gets
the part that is its own (``for_worker``) and asks it at the points where a fault can strike.
Faults fire in the first incarnation of a run only: a restart is how you get past them.

One fault is armed while the run goes on instead: a signal for a process, written to ``RUN/faults/armed.json``
(``ARMED``), which the student sends at the start of its next weight sync (``WorkerFaults.fire_armed``). A sync
lasts tens of milliseconds, too short for anything outside the run to aim a fault into; the random trials
(bench/chaos_trials.py) arm it so that a fault lands inside one. It writes ``armed.fired`` with when it fired.
Only who can write the run's folder (0700: its owner, who can signal their own processes anyway) can arm one;
the student looks for the file with one stat a sync.

A fault of the config's kinds can be armed for one worker the same way (``arm_fault``: ``RUN/faults/armed/SRC.json``,
a fault's fields without its step): the worker claims it at its next point where a fault can strike (a step's
generate or train, a sync's start, a teacher's request), as a fault of that step, and writes ``SRC.fired`` when it
strikes. The random trials arm them (a rank that never joins, a hang inside the sync, memory growing to the OOM
killer, a teacher answering errors, a slow worker), each at a moment drawn at random.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from gkd_core.config import FaultConfig

DRIVER_KINDS = ("kill_teacher", "delay_teacher", "error_teacher", "disk_full", "hang_nvml")
ARMED = Path("faults") / "armed.json"  # in the run's folder: {"pid": N, "signal": "SIGSTOP" | "SIGKILL"}
ARMED_FAULTS = Path("faults") / "armed"  # in the run's folder: SRC.json, a fault armed for that worker


def armed_file(run_dir: Path, src: str) -> Path:
    """Where a fault armed for ``src`` is written ("rollout/1" -> RUN/faults/armed/rollout-1.json)."""
    return run_dir / ARMED_FAULTS / f"{src.replace('/', '-')}.json"


def arm_fault(run_dir: Path, src: str, kind: str, **fields: float | str) -> Path:
    """Arm a fault of ``kind`` (the config's fields but its step and target) for ``src``, struck at its next point
    where that kind can strike; returns the file that says when it struck (JSON: src, kind, ts)."""
    msgspec.convert({"kind": kind, "target": src, **fields}, FaultConfig)  # refused here, not in the worker
    path = armed_file(run_dir, src)
    path.parent.mkdir(parents=True, exist_ok=True)
    fired = path.with_suffix(".fired")
    fired.unlink(missing_ok=True)
    tmp = path.with_name(f"{path.name}.tmp")  # (not the .fired's own: a worker may write that one meanwhile)
    tmp.write_text(json.dumps({"kind": kind, **fields}))
    tmp.rename(path)
    return fired


def arm(run_dir: Path, pid: int, sig: signal.Signals) -> Path:
    """Arm ``sig`` for ``pid``, sent at the start of the run's next weight sync; returns the file that says when
    it fired (JSON: pid, signal, ts, by). Written whole (a rename), so the student never reads half of it."""
    path = run_dir / ARMED
    path.parent.mkdir(parents=True, exist_ok=True)
    fired = path.with_suffix(".fired")
    fired.unlink(missing_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": pid, "signal": sig.name}))
    tmp.rename(path)
    return fired


@dataclass
class WorkerFaults:
    """One worker's faults (sent to its actor): each step-bound fault fires once."""

    faults: list[FaultConfig] = field(default_factory=list)
    _first_struck: dict[int, float] = field(default_factory=dict)  # id of a lasting fault -> when it first struck
    armed: str = ""  # RUN/faults/armed.json, for the worker that fires an armed signal (the student); else ""
    armed_fault: str = ""  # RUN/faults/armed/SRC.json: a fault armed for this worker while the run goes on
    _struck: dict[int, str] = field(default_factory=dict)  # id of an armed fault -> its .fired file, until it strikes

    def claim_armed(self, src: str, step: int, log: Callable[[str], None]) -> FaultConfig | None:
        """A fault armed for this worker, if one is (a stat when none is), made a fault of ``step``: it strikes
        where its kind does, from now. Claimed by a rename, so it is taken once; one that does not parse is set
        aside and said."""
        if not self.armed_fault or not os.path.exists(self.armed_fault):
            return None
        claimed = Path(f"{self.armed_fault}.{os.getpid()}.{threading.get_ident()}")  # (an actor's threads apart)
        try:
            os.rename(self.armed_fault, claimed)
            f = msgspec.json.decode(claimed.read_bytes(), type=FaultConfig)
        except FileNotFoundError:
            return None
        except (OSError, msgspec.ValidationError, msgspec.DecodeError) as e:
            log(f"fault not armed: {claimed} is no fault ({type(e).__name__}: {e}); want the config's fields, "
                'e.g. {"kind": "hang_sync", "seconds": 20}')
            return None
        with contextlib.suppress(OSError):
            claimed.unlink()
        f.step, f.target = step, src
        self.faults.append(f)
        self._struck[id(f)] = str(Path(self.armed_fault).with_suffix(".fired"))
        log(f"fault armed: {f.kind} for {src} from step {step}")
        return f

    def struck(self, f: FaultConfig) -> None:
        """An armed fault strikes now: its ``.fired`` file says when (written whole, once)."""
        fired = self._struck.pop(id(f), None)
        if fired is not None:
            tmp = Path(f"{fired}.tmp")
            try:
                tmp.write_text(json.dumps({"src": f.target, "kind": f.kind, "ts": time.time()}))
                tmp.rename(fired)
            except OSError:  # (the run's folder gone or full: the fault strikes all the same, unsaid)
                pass

    def fire_armed(self, src: str, log: Callable[[str], None], flush: Callable[[], object]) -> None:
        """Send the signal armed for this moment, if one is (a stat when none is). The file is claimed by a
        rename, so it fires once; ``armed.fired`` says when, and is written before the signal (the student may
        be its own target). A file that does not parse is set aside and said."""
        if not self.armed or not os.path.exists(self.armed):
            return
        claimed = Path(f"{self.armed}.{os.getpid()}")
        try:
            os.rename(self.armed, claimed)
            spec = json.loads(claimed.read_text())
            pid, sig = int(spec["pid"]), signal.Signals[spec["signal"]]
        except FileNotFoundError:
            return  # disarmed, or fired by another
        except (OSError, ValueError, KeyError, TypeError) as e:
            log(f"fault not fired: {claimed} is no armed signal ({type(e).__name__}: {e}); want "
                '{"pid": N, "signal": "SIGSTOP"}')
            return
        claimed.unlink(missing_ok=True)
        log(f"fault injected: {src} sends {sig.name} to pid {pid} at the start of its weight sync (armed)")
        flush()  # its word that it entered the sync, and this one, leave before a signal that may be its own
        fired = Path(self.armed).with_suffix(".fired")
        fired.with_suffix(".tmp").write_text(json.dumps({"pid": pid, "signal": sig.name, "ts": time.time(),
                                                         "by": src}))
        fired.with_suffix(".tmp").rename(fired)  # whole: the harness reads it as soon as it is there
        try:
            os.kill(pid, sig)
        except OSError as e:  # gone, or not ours: the harness's mistake, never the sync's failure
            log(f"fault not fired: {sig.name} to pid {pid}: {e}")

    def take(self, kind: str, step: int, part: str = "") -> FaultConfig | None:
        """The fault of this kind at this step (and in this part of a sync), consumed."""
        for f in self.faults:
            if f.kind == kind and f.step == step and f.part == part:
                self.faults.remove(f)
                self.struck(f)
                return f
        return None

    def nan_grad(self, step: int) -> bool:
        """From its step, `repeat` steps in a row, or every step for `seconds` after the first."""
        now = time.monotonic()
        for f in self.faults:
            if f.kind != "nan_grad" or step < f.step:
                continue
            first = self._first_struck.setdefault(id(f), now)  # not its index: `take` removes others
            if step < f.step + max(1, f.repeat) or (f.seconds and now - first < f.seconds):
                return True
        return False

    def slow_factor(self, step: int) -> float:
        """`slow_worker`: how much longer each generation takes from its step on (0: not slowed), for `seconds`
        after the first slowed one when those are given."""
        return sum(f.factor for f in self.striking("slow_worker", step))

    def striking(self, kind: str, step: int) -> list[FaultConfig]:
        """The faults of a kind that last from their step on (for `seconds` after they first strike, when given),
        striking now: the first strike of each is noted (its time, and an armed one's ``.fired``)."""
        now = time.monotonic()
        out = []
        for f in self.faults:
            if f.kind != kind or step < f.step:
                continue
            first = self._first_struck.setdefault(id(f), now)
            if f.seconds and now - first >= f.seconds:
                continue
            self.struck(f)
            out.append(f)
        return out


@dataclass
class FaultPlan:
    faults: list[FaultConfig]

    @classmethod
    def for_run(cls, faults: list[FaultConfig], restart: int) -> FaultPlan:
        return cls(list(faults) if restart == 0 else [])

    def for_worker(self, src: str, run_dir: Path | None = None) -> WorkerFaults:
        # a NaN gradient is the student's whatever its target says: it is where gradients are; so is an armed
        # signal (it fires at the start of the student's sync, which every weight sync has)
        return WorkerFaults([f for f in self.faults if f.kind not in DRIVER_KINDS
                             and (f.target == src or (f.kind == "nan_grad" and src == "student/0"))],
                            armed=str(run_dir / ARMED) if run_dir is not None and src == "student/0" else "",
                            armed_fault=str(armed_file(run_dir, src)) if run_dir is not None else "")

    def at(self, kind: str, step: int) -> FaultConfig | None:
        return next((f for f in self.faults if f.kind == kind and f.step == step), None)

    def ends(self, kind: str, step: int) -> FaultConfig | None:
        """The fault of this kind whose one step was the step before: to undo now."""
        return next((f for f in self.faults if f.kind == kind and f.step == step - 1), None)

    def disk_full(self, step: int) -> bool:
        return any(f.kind == "disk_full" and f.step <= step < f.step + max(1, f.repeat) for f in self.faults)

    def gpu_backend(self, configured: str) -> str:
        """`hang_nvml` swaps in the test GPU backend, hanging on that sample."""
        f = next((f for f in self.faults if f.kind == "hang_nvml"), None)
        return f"fake:gpus=1,hang_at={f.step}" if f else configured


def kill_as_the_kernel_would(name: str, actor, rep) -> None:
    """SIGKILL an actor's process, as the OOM killer or a crash ends one: ``ray.kill`` would be on record as a
    kill on purpose, which the diagnosis rightly does not call a death. Another node's process is out of reach
    of a signal from here: that one goes by ``ray.kill``, and the log says so."""
    import ray  # here, not at the top: the plan itself is read without Ray (the config's checks, tests)

    from gkd_core.trainer.guarded import guarded_wait

    info = guarded_wait({name: actor.ready.remote()}, 10.0, phase="fault")[name]
    if info["node"] == socket.gethostname():
        os.kill(info["pid"], signal.SIGKILL)
    else:
        rep.log(f"fault: {name} is on {info['node']}, out of a signal's reach: ray.kill instead", level="warn")
        ray.kill(actor, no_restart=True)
