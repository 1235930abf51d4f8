"""Ready for the first GPU: NVML, the GPU memory each process holds and the CUDA path, on a real one.

    python bench/gpu_check.py [--smoke] [--out DIR]     (--smoke: the same check)

Five parts, each PASS, FAIL or SKIP with its reason and time, in under five minutes: ``nvml``, every
GPU read through the node agent's own sampler (NVML in a child process, under a deadline); ``proc_mem``,
this script allocates CUDA memory and NVML must list its pid holding as much; ``fingerprint``, the
demo's student generates with the torch engine on the CPU and on CUDA with the same weight fingerprint,
the same again in a CPU copy sent the weights as one vector after a training step on CUDA;
``smi_hang``, an ``nvidia-smi`` stopped by SIGSTOP is flagged within its timeout, then killed;
``screenshot``, the NVML pane with these readings as Textual SVG under ``--out`` (by default a new
temporary folder). Without a GPU (no NVIDIA driver, or NVML sees none) it says so in one line and
exits 0; without CUDA in torch the CUDA parts skip; it exits 1 if a part fails. ``--backend fake:gpus=2``
rehearses it without a GPU.

It imports neither Ray nor ZeroMQ. A GPU image with torch (CUDA) and nvidia-ml-py may lack:

    msgspec         every part: the events, the sampler and its child
    numpy           the torch engine and the fingerprint (torch's images usually carry it)
    transformers    the fingerprint's GPT-2, with its own: tokenizers, safetensors, huggingface-hub,
                    pyyaml, regex, packaging, requests, tqdm, filelock
    pyyaml          gkd_core.config (the demo's model sizes) and the dashboard's state
    textual, rich   the screenshot only

Carried along as files, downloaded for the same Python where a registry can be reached:
``pip download -d wheels msgspec numpy transformers pyyaml textual rich``, then
``pip install --no-deps --target carried wheels/*.whl`` and ``PYTHONPATH=carried python bench/gpu_check.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# the sampler's child runs `python -m gkd_core.node.gpu_child`: it must find the package from anywhere
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

from gkd_core.node.gpu_sampler import TICK_S, GpuSampler  # noqa: E402  (msgspec only)
from gkd_core.state.gpu_cases import event_of  # noqa: E402
from gkd_core.telemetry import events as ev  # noqa: E402

TOTAL_S = 270.0  # the whole check; past it the watchdog prints every thread's stack and exits 1
FIRST_READING_S = 30.0  # the child starts, imports nvidia-ml-py and calls nvmlInit: seconds on a big node
SAMPLE_S = 0.5  # the sampler's interval here (the agent's is 2 s): fresh readings come quickly
DEADLINE_S = 3.0  # an NVML call unanswered this long is reported hung (the agent's default)
ALLOC_MIB = 256  # what this script allocates on the GPU, to find itself among NVML's processes
SMI_TIMEOUT_S = 2.0  # the frozen nvidia-smi's timeout here (the agent's is 5 s)
SLACK_S = 2.0  # beyond a timeout, for the sampler's tick and a busy machine
SHOT_S = 60.0
SHOT_SIZE = (110, 14)


class NoGpu(Exception):
    """Nothing to check on this machine, and why: the whole check is skipped, not failed."""


class Skip(Exception):
    """A part that cannot run here, and why."""


class Failed(Exception):
    """A part that ran and found something wrong."""


class Recorder:
    """The sampler's ``emit``: its gpu events, each with when it came (monotonic), safe across its thread."""

    def __init__(self):
        self.events: list[tuple[float, ev.GpuEvent]] = []
        self.lock = threading.Lock()

    def __call__(self, e: ev.Event) -> None:
        e.ts = e.ts or time.time()  # as the agent's Reporter stamps them
        # a note, or a sample's readings as the node's batch holds them (each at the batch's node and time)
        said = [e] if isinstance(e, ev.GpuEvent) else [
            event_of(r, e.node, e.ts) for r in e.readings] if isinstance(e, ev.GpusEvent) else []
        with self.lock:
            self.events += [(time.monotonic(), g) for g in said]

    def found(self, pred: Callable[[ev.GpuEvent], bool]) -> list[tuple[float, ev.GpuEvent]]:
        with self.lock:
            return [(t, e) for t, e in self.events if pred(e)]

    def wait_for(self, pred: Callable[[ev.GpuEvent], bool], timeout_s: float) -> tuple[float, ev.GpuEvent] | None:
        deadline = time.monotonic() + timeout_s
        while not (hits := self.found(pred)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return hits[0] if hits else None

    def latest_readings(self) -> list[ev.GpuEvent]:
        """The last reading of each GPU."""
        last = {e.index: e for _, e in self.found(lambda e: e.index >= 0)}
        return [last[i] for i in sorted(last)]

    def notes(self) -> list[str]:
        """What the sampler said about the node rather than a GPU (an NVML error, its child's exit)."""
        return [e.error for _, e in self.found(lambda e: e.index < 0 and bool(e.error) and e.nvml_hung_s is None)]


class Watchdog:
    """Every wait below has its own deadline; this one is for a call that never returns (a CUDA call
    on a wedged driver): the check says which part it was in, prints every thread's stack, and exits."""

    def __init__(self, limit_s: float):
        self.limit_s, self.part, self.done = limit_s, "start", threading.Event()
        self.cleanups: list[Callable[[], None]] = []  # what would outlive us otherwise (a stopped nvidia-smi)
        threading.Thread(target=self._watch, name="gpu-check-watchdog", daemon=True).start()

    def _watch(self) -> None:
        if not self.done.wait(self.limit_s):
            print(f"FAIL {self.part}: still running after {self.limit_s:.0f} s; every thread's stack:", flush=True)
            faulthandler.dump_traceback(all_threads=True)
            for cleanup in self.cleanups:
                cleanup()
            os._exit(1)  # the samplers' children die with us (gkd_core.lifeline)


def size(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def cuda_torch():
    """torch, where it has CUDA; else Skip, saying why."""
    try:
        import torch
    except ImportError as e:
        raise Skip(f"torch is not importable ({e})") from None
    if not torch.cuda.is_available():
        raise Skip(f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA {torch.version.cuda})")
    return torch


class GpuCheck:
    def __init__(self, backend: str, watchdog: Watchdog):
        self.backend, self.watchdog, self.out = backend, watchdog, Path()  # out: set once there is a GPU
        self.node, self.rec = socket.gethostname(), Recorder()
        # (every reading sent, past the node's deadband or not: the check reads each sample)
        self.sampler = GpuSampler(self.node, self.rec, backend=backend, interval_s=SAMPLE_S, deadline_s=DEADLINE_S,
                                  smi=None, full_every_s=0)
        self.held = []  # the CUDA memory this script holds until it ends

    def wait_samples(self, wanted: int, limit_s: float, or_note: bool = False) -> None:
        """Until the sampler has answered ``wanted`` samples (or, ``or_note``, said why it cannot)."""
        deadline = time.monotonic() + limit_s
        while self.sampler.samples < wanted and not (or_note and (self.sampler.no_driver or self.rec.notes())):
            if time.monotonic() > deadline:
                hung = self.sampler.hung_s
                raise Failed(f"no NVML sample within {limit_s:.0f} s"
                             + (f": its call has not returned for {hung:.1f} s" if hung else ""))
            time.sleep(0.05)

    def fresh_readings(self) -> list[ev.GpuEvent]:
        """Readings from a sample requested after this call (the one in flight may be older)."""
        self.wait_samples(self.sampler.samples + 2, 2 * SAMPLE_S + DEADLINE_S + SLACK_S)
        return self.rec.latest_readings()

    def nvml(self) -> str:
        self.sampler.start()
        self.wait_samples(2, FIRST_READING_S, or_note=True)  # the first's events are all in once a second counts
        if self.sampler.no_driver:
            raise NoGpu(self.sampler.no_driver)
        if self.rec.notes() and not self.sampler.samples:  # an NVML error, or no nvidia-ml-py in the child
            raise Failed(self.rec.notes()[0])
        readings = self.rec.latest_readings()
        if not readings:
            raise NoGpu("NVML answers, and sees no GPU on this node")
        for g in readings:
            held = ", ".join(f"{pid}: {size(b)}" for pid, b in sorted(g.proc_mem.items(), key=lambda kv: int(kv[0])))
            print(f"  GPU{g.index} {g.uuid} util {g.util or 0:.0f}% mem {size(g.mem_used)}/{size(g.mem_total)} "
                  f"temp {g.temp}C power {g.power}W pids {g.pids} proc_mem {{{held}}}", flush=True)
        wrong = [f"GPU{g.index}: {why}" for g in readings for why in (
            "no uuid" if not g.uuid else "", "no memory total" if not g.mem_total else "", g.error) if why]
        if wrong:
            raise Failed("; ".join(wrong))
        return (f"{len(readings)} GPU(s) read through the node agent's sampler (backend {self.backend!r}, "
                f"a child process, {DEADLINE_S:.0f} s deadline)")

    def allocate(self, torch) -> list[ev.GpuEvent]:
        """ALLOC_MIB more of CUDA memory held, then readings taken after it."""
        self.held.append(torch.ones(ALLOC_MIB << 20, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
        return self.fresh_readings()

    def proc_mem(self) -> str:
        if self.backend != "nvml":
            raise Skip(f"backend {self.backend!r} lists no processes")
        torch, me = cuda_torch(), os.getpid()
        before = self.allocate(torch)
        print("  the GPU memory each process holds, by NVML:", flush=True)
        for g in before:
            for pid in g.pids:
                print(f"    GPU{g.index} pid {pid:>8d}  {size(g.proc_mem.get(str(pid)))}"
                      + ("  (this script)" if pid == me else ""), flush=True)
        mine = {g.index: g.proc_mem.get(str(me)) for g in before if me in g.pids}
        if any(b is not None and b >= ALLOC_MIB << 20 for b in mine.values()):
            return (f"this process (pid {me}) holds {', '.join(f'{size(b)} on GPU{i}' for i, b in mine.items())} "
                    f"by NVML, having allocated {ALLOC_MIB} MiB (CUDA's context comes on top)")
        if mine:
            raise Failed(f"NVML lists this process (pid {me}) with {', '.join(map(size, mine.values()))}: less than "
                         f"the {ALLOC_MIB} MiB it allocated, or no figure (NVML's 'not available')")
        # allocate as much again: a pid whose memory grows by it is this process under another name
        was = {(g.index, pid): b for g in before for pid, b in g.proc_mem.items()}
        grew = [f"pid {pid} on GPU{g.index}" for g in self.allocate(torch) for pid, b in g.proc_mem.items()
                if abs(b - was.get((g.index, pid), 0) - (ALLOC_MIB << 20)) <= 64 << 20]
        raise Failed(f"NVML does not list this process (pid {me}); " + (
            f"{', '.join(grew)} grew by the {ALLOC_MIB} MiB it allocated again: NVML names processes as another "
            "PID namespace sees them (the container's host), so the agent's pids will not match the workers' own"
            if grew else f"no process's memory grew when it allocated {ALLOC_MIB} MiB more"))

    def fingerprint(self) -> str:
        return weights_on_cuda(cuda_torch())

    def smi_hang(self) -> str:
        folder = Path(tempfile.mkdtemp(prefix="gkd-frozen-smi-"))
        smi, pidfile = folder / "nvidia-smi", folder / "pid"
        # it stops itself before it starts: frozen, as the seeds' users saw nvidia-smi on a wedged driver
        real = shutil.which("nvidia-smi") or "false"
        smi.write_text(f"#!/bin/sh\necho $$ > '{pidfile}'\nkill -STOP $$\nexec '{real}' \"$@\"\n")
        smi.chmod(0o755)
        rec = Recorder()
        sampler = GpuSampler(self.node, rec, backend=self.backend, interval_s=SAMPLE_S, deadline_s=DEADLINE_S,
                             smi=str(smi), smi_timeout_s=SMI_TIMEOUT_S, smi_every_s=3600.0)
        self.watchdog.cleanups.append(lambda: clear_frozen(folder))
        limit_s, t0 = SMI_TIMEOUT_S + TICK_S + SLACK_S, time.monotonic()
        try:
            sampler.start()
            hit = rec.wait_for(lambda e: e.probe == "nvidia-smi" and e.nvml_hung_s is not None, limit_s)
            if hit is None:
                raise Failed(f"a frozen nvidia-smi was not flagged within {limit_s:.1f} s (its timeout "
                             f"{SMI_TIMEOUT_S:.0f} s); the sampler said {rec.notes()[-3:]}")
            flagged_s = hit[0] - t0
            # killed and reaped: the sampler says so (the banner clears)
            if rec.wait_for(lambda e: e.probe == "nvidia-smi" and e.nvml_hung_s is None, 2 * TICK_S + SLACK_S) is None:
                raise Failed(f"the frozen nvidia-smi was flagged after {flagged_s:.1f} s but not killed")
            return (f"an nvidia-smi stopped by SIGSTOP was flagged after {flagged_s:.1f} s (its timeout "
                    f"{SMI_TIMEOUT_S:.0f} s): \"{hit[1].error}\"; then killed")
        finally:
            sampler.stop()
            clear_frozen(folder)

    def screenshot(self) -> str:
        try:
            from textual.app import App
            from textual.containers import Vertical

            from gkd_core.state import RunState
            from gkd_tui.theme import THEME_VARIABLES
            from gkd_tui.widgets.nvml_pane import NvmlPane
        except ImportError as e:
            raise Skip(f"Textual (or another of the dashboard's wheels) is not importable here ({e})") from None
        state = RunState()
        for g in self.fresh_readings():
            state.apply(g)

        class NvmlPaneApp(App):
            CSS_PATH = ROOT / "gkd_tui" / "app.tcss"

            def get_theme_variable_defaults(self) -> dict[str, str]:
                return dict(THEME_VARIABLES)

            def compose(self):
                pane = NvmlPane()
                pane.border_title = "GPU / NVML"
                side = Vertical(pane, id="side")  # framed as in the dashboard, over the whole width
                side.styles.width = "100%"
                yield side

        async def shoot() -> str:
            app = NvmlPaneApp()
            async with app.run_test(size=SHOT_SIZE) as pilot:
                app.query_one(NvmlPane).show(state, time.time())
                await pilot.pause()
                return app.save_screenshot(filename="nvml_pane.svg", path=str(self.out))

        return f"the NVML pane with these readings: {asyncio.run(asyncio.wait_for(shoot(), SHOT_S))}"

    def close(self) -> None:
        self.sampler.stop()


def weights_on_cuda(torch) -> str:
    """The demo's student on the CPU and on CUDA: the same fingerprint, before and after a step on CUDA."""
    try:  # what a GPU image may lack (this script's docstring); gkd_core.config needs pyyaml
        import numpy as np
        from transformers import GPT2LMHeadModel

        from gkd_core.config import ModelConfig, RolloutConfig
    except ImportError as e:
        raise Failed(f"this part needs {e.name}, not importable here ({e}): carry it along") from None
    from gkd_core.trainer import models, task, torch_engine
    from gkd_core.trainer.fingerprints import fingerprint

    m = ModelConfig()
    shape = models.gpt2_config(m.n_layer, m.n_embd, m.n_head)
    torch.manual_seed(0)  # as the demo's student is made (models.prepare_demo)
    model = GPT2LMHeadModel(shape).eval()
    prompts = np.array([[task.VOCAB.index(w) for w in ex.prompt] for ex in task.prompts(seed=0, n=8)])

    def generate() -> np.ndarray:
        return torch_engine.generate(model, prompts, np.zeros(len(prompts), dtype=np.int64), temperature=0.0, seed=0,
                                     eos_ids=[shape.eos_token_id], pad_id=shape.pad_token_id,
                                     max_new_tokens=RolloutConfig().max_new_tokens)

    on_cpu, rows_cpu = fingerprint(model.parameters()), generate()
    model.to("cuda")
    on_cuda, rows_cuda = fingerprint(model.parameters()), generate()
    # a training step on the GPU, then its weights to a CPU copy as a sync sends them: one flat vector
    opt = torch.optim.AdamW(model.train().parameters(), lr=1e-3)
    batch = torch.as_tensor(rows_cuda, dtype=torch.long, device="cuda")
    model(input_ids=batch, labels=batch).loss.backward()
    opt.step()
    trained, copy = fingerprint(model.parameters()), GPT2LMHeadModel(shape)
    vec = torch.nn.utils.parameters_to_vector([p.detach() for p in model.parameters()]).cpu()
    torch.nn.utils.vector_to_parameters(vec, list(copy.parameters()))
    received = fingerprint(copy.parameters())
    wrong = [why for bad, why in (
        (on_cuda != on_cpu, f"moved to CUDA, the weights' fingerprint is {on_cuda}, on the CPU {on_cpu}"),
        (trained == on_cuda, "a training step on CUDA left the weights as they were"),
        (received != trained, f"after a step on CUDA the fingerprint is {trained}, in the CPU copy sent it {received}"),
    ) if bad]
    n_same = int((rows_cpu == rows_cuda).all(axis=1).sum()) if rows_cpu.shape == rows_cuda.shape else 0
    same = f"greedy generation: {n_same}/{len(prompts)} rows token for token the same on CUDA as on the CPU" + (
        "" if n_same == len(prompts) else " (an untrained model's near ties may round either way on another device)")
    if wrong:
        raise Failed("; ".join(wrong) + f"; {same}")
    return (f"the student ({m.n_layer} layers, {m.n_embd} wide) has fingerprint {on_cpu} on the CPU and on CUDA; "
            f"after a training step on CUDA {trained}, the same in a CPU copy that received them as one vector; "
            f"{same}")


def clear_frozen(folder: Path) -> None:
    """The frozen nvidia-smi, should the sampler have left it (SIGKILL, if that pid is still it), and its folder."""
    try:
        pid = int((folder / "pid").read_text())
        if str(folder / "nvidia-smi") in Path(f"/proc/{pid}/cmdline").read_text():
            os.kill(pid, signal.SIGKILL)  # works on a stopped process too
    except (OSError, ValueError):
        pass  # never written, or already gone
    shutil.rmtree(folder, ignore_errors=True)


def run_part(watchdog: Watchdog, name: str, part: Callable[[], str]) -> str:
    """PASS, FAIL or SKIP, printed with the reason and the time; NoGpu is passed on."""
    watchdog.part, t0 = name, time.monotonic()
    try:
        verdict, detail = "PASS", part()
    except (Skip, Failed) as e:
        verdict, detail = "SKIP" if isinstance(e, Skip) else "FAIL", str(e)
    except NoGpu:
        raise
    except Exception as e:  # a part's edge: whatever it raised is its failure, said with its stack
        verdict, detail = "FAIL", f"{type(e).__name__}: {e}"
        traceback.print_exc()
    print(f"{verdict} {name:<11s} {time.monotonic() - t0:6.1f} s  {detail}", flush=True)
    return verdict


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="the same check (bench/smoke.sh passes it to every bench)")
    p.add_argument("--out", type=Path, help="where the screenshot goes (default: a new temporary folder)")
    p.add_argument("--backend", default="nvml", help="the sampler's backend: nvml, or fake:gpus=2 for a rehearsal")
    args = p.parse_args()
    t0 = time.monotonic()
    watchdog = Watchdog(TOTAL_S)
    check = GpuCheck(args.backend, watchdog)
    verdicts = []
    try:
        verdicts.append(run_part(watchdog, "nvml", check.nvml))
        check.out = args.out or Path(tempfile.mkdtemp(prefix="gkd-gpu-check-"))
        check.out.mkdir(parents=True, exist_ok=True)
        print(f"gpu_check on {check.node}: files under {check.out}", flush=True)
        for name in ("proc_mem", "fingerprint", "smi_hang", "screenshot"):
            verdicts.append(run_part(watchdog, name, getattr(check, name)))
    except NoGpu as e:
        print(f"gpu_check: no GPU here: {e}; nothing to check ({time.monotonic() - t0:.1f} s)", flush=True)
        return 0
    finally:
        check.close()
        watchdog.done.set()
    failed = verdicts.count("FAIL")
    print(f"gpu_check: {verdicts.count('PASS')} passed, {failed} failed, {verdicts.count('SKIP')} skipped "
          f"in {time.monotonic() - t0:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
