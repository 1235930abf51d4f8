"""The trainer's metrics where its users keep them (``trainer.logger``, as verl's and TRL's ``report_to``):

- ``console``: a line a step in the driver's log (``logs/driver.log``);
- ``tensorboard``: event files in ``RUN/tensorboard`` (torch's SummaryWriter; the ``loggers`` extra);
- ``wandb``: a W&B run in ``RUN/wandb``, named after the run. Offline unless the environment has an API key
  or says otherwise (``WANDB_MODE``): never a login prompt in a driver nobody answers. ``wandb sync
  RUN/wandb/offline-run-*`` uploads it later.

The names are the plots' (the ``metrics`` event's fields: ``loss``, ``kl``, ``agreement``, ``tokens_per_s`` …),
the step parts' seconds as ``timing/<part>``; a value a step does not have is not written. A logger that fails
(a full disk, W&B's service gone) is said once in the run's log and dropped: training goes on.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from gkd_core.telemetry import events as ev

SCALARS = ("loss", "kl", "agreement", "eval_kl", "tokens_per_s", "grad_norm", "sample_agreement", "completion_len",
           "eos_share", "epoch")
CONSOLE = ("loss", "kl", "agreement", "tokens_per_s")
WANDB_INIT_TIMEOUT_S = 60.0


def scalars(m: ev.MetricsEvent) -> dict[str, float]:
    """A step's metrics by the plots' names; a missing value left out."""
    out = {name: float(v) for name in SCALARS if (v := getattr(m, name)) is not None}
    out.update({f"timing/{part}": float(s) for part, s in m.timing.items()})
    return out


class _Logger(Protocol):
    def write(self, step: int, values: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class _Console:
    def write(self, step: int, values: dict[str, float]) -> None:  # (the driver's stdout is logs/driver.log)
        print(f"step {step}: " + "  ".join(f"{k} {values[k]:.4g}" for k in CONSOLE if k in values), flush=True)

    def close(self) -> None:
        pass


class _TensorBoard:
    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(folder))

    def write(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()  # a step's values readable at once, and not lost with a killed driver

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, folder: Path, run_id: str, config: dict[str, Any]):
        import wandb

        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "gkd"), name=run_id, dir=str(folder.parent),
                              config=config, mode=mode,  # type: ignore[arg-type]  # (a str the SDK checks itself)
                              settings=wandb.Settings(init_timeout=WANDB_INIT_TIMEOUT_S, silent=True))

    def write(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricLoggers:
    """The loggers ``names`` asks for, each step's metrics written to every one (``write``); ``say`` puts a line
    in the run's log (a logger's failure)."""

    def __init__(self, names: Sequence[str], run_dir: Path, config: dict[str, Any], say: Callable[[str, str], None]):
        self.say = say
        self.loggers: dict[str, _Logger] = {}
        for name in dict.fromkeys(names):
            try:
                self.loggers[name] = self._open(name, run_dir, config)
            except Exception as e:  # a logger is never worth the run: said, and the run trains without it
                say(f"trainer.logger {name}: not started ({type(e).__name__}: {e}); the run goes on without it",
                    "warn")

    def _open(self, name: str, run_dir: Path, config: dict[str, Any]) -> _Logger:
        if name == "console":
            return _Console()
        if name == "tensorboard":
            return _TensorBoard(run_dir / "tensorboard")
        return _WandB(run_dir / "wandb", run_dir.name, config)

    def write(self, m: ev.MetricsEvent) -> None:
        if not self.loggers:
            return
        values = scalars(m)
        for name, logger in list(self.loggers.items()):
            try:
                logger.write(m.step, values)
            except Exception as e:  # (as at the start: said once, and dropped)
                del self.loggers[name]
                self.say(f"trainer.logger {name}: failed at step {m.step} ({type(e).__name__}: {e}); dropped, the "
                         "run goes on without it", "warn")

    def close(self) -> None:
        for name, logger in self.loggers.items():
            try:
                logger.close()
            except Exception as e:  # the run has ended: its last values may be missing from this logger alone
                self.say(f"trainer.logger {name}: not closed cleanly ({type(e).__name__}: {e})", "warn")
        self.loggers = {}
