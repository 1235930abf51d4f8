"""A vLLM engine's counts on their way to the worker's details, without vLLM: a metric the engine does not have
(renamed by another version) is said once and shown as unknown, never as a measured 0."""

from __future__ import annotations

from dataclasses import dataclass, field

from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.trainer.engine_stats import EngineStatsWatch
from gkd_core.trainer.vllm_engine import METRICS, engine_counts
from gkd_tui.screens.worker_details import WorkerDetails

NEVER_S = 3600.0  # the watch's own thread never reads in these tests: each read is the test's


@dataclass
class Metric:
    """What ``vllm.LLM.get_metrics()`` gives (``vllm.v1.metrics.reader``'s Counter and Gauge): a name, its
    labels and a value."""

    name: str
    value: float
    labels: dict = field(default_factory=dict)


class Engine:
    """An engine whose metrics are the snapshot given: ``get_metrics`` is all ``engine_counts`` asks of it."""

    def __init__(self, metrics: list[Metric]):
        self.metrics = metrics

    def get_metrics(self) -> list[Metric]:
        return self.metrics


def snapshot(**values: float) -> list[Metric]:
    return [Metric(METRICS[k], v) for k, v in values.items()]


class Supervisor:
    """The way an event takes from a worker's Reporter to a dashboard, in this process: encoded as the Reporter
    sends it, decoded as the supervisor takes it in, applied to the one reducer."""

    def __init__(self, src: str):
        self.src = src
        self.state = RunState()
        self.logs: list[ev.LogEvent] = []
        self.emit(ev.WorkerEvent(role=src.split("/")[0], rank=0, pid=4121))

    def emit(self, event: ev.Event) -> None:
        event.src, event.ts = self.src, event.ts or 1000.0
        _, typed = wire.decode_dict(wire.encode(event))
        if isinstance(typed, ev.LogEvent):
            self.logs.append(typed)
        self.state.apply(typed)

    def log(self, message: str, level: str = "info") -> None:
        self.emit(ev.LogEvent(level=level, message=message))


def test_every_count_read_from_its_own_metric():
    got = engine_counts(Engine(snapshot(running=3, waiting=2, kv_cache=0.123456, preemptions=1, generated=640)))
    assert got == {"engine": "vllm", "missing": [], "running": 3, "waiting": 2, "kv_cache": 0.1235,
                   "preemptions": 1, "generated": 640}


def test_a_metric_the_engine_does_not_have_is_said_once_and_shown_as_unknown_never_as_0():
    engine = Engine(snapshot(waiting=0, kv_cache=0.5, preemptions=0, generated=100))  # no num_requests_running
    got = engine_counts(engine)
    assert got["running"] is None and got["waiting"] == 0, got
    assert got["missing"] == ["vllm:num_requests_running"]

    sup = Supervisor("rollout/0")
    watch = EngineStatsWatch(lambda: engine_counts(engine), sup, every_s=NEVER_S)
    try:
        assert watch.read_once()
        engine.metrics = snapshot(waiting=4, kv_cache=0.75, preemptions=0, generated=180)  # a later read, still none
        assert watch.read_once()
    finally:
        watch.close()
    warned = [e.message for e in sup.logs if e.level == "warn"]
    assert warned == ["engine stats: the engine has no metric vllm:num_requests_running (renamed in this "
                      "version?): running shown as unknown"], warned
    counts = sup.state.workers["rollout/0"].engine
    assert counts is not None and counts.running is None and counts.waiting == 4 and counts.generated == 180
    text = WorkerDetails.describe(sup.state, "rollout/0", 1001.0)
    assert ("engine vllm: ? running, 4 waiting, KV cache 75 %, 0 preempted, 180 tokens generated"
            in text.splitlines()), text


def test_a_second_metric_gone_later_is_said_too_and_a_count_that_comes_back_is_shown_again():
    engine = Engine(snapshot(running=1, waiting=0, kv_cache=0.1, preemptions=0, generated=10))
    sup = Supervisor("teacher/0")
    watch = EngineStatsWatch(lambda: engine_counts(engine), sup, every_s=NEVER_S)
    try:
        assert watch.read_once()
        engine.metrics = snapshot(running=1, waiting=0, preemptions=0)
        assert watch.read_once()
        engine.metrics = snapshot(running=2, waiting=0, preemptions=0, generated=30)
        assert watch.read_once()
    finally:
        watch.close()
    assert [e.message for e in sup.logs] == [
        "engine stats: the engine has no metric vllm:kv_cache_usage_perc, vllm:generation_tokens (renamed in this "
        "version?): generated, kv_cache shown as unknown"]
    line = WorkerDetails.describe(sup.state, "teacher/0", 1001.0).splitlines()
    assert "engine vllm: 2 running, 0 waiting, KV cache ?, 0 preempted, 30 tokens generated" in line
