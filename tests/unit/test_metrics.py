"""supervisor/metrics: a run's state as Prometheus text, read back by prometheus_client's own parser: a hung
worker's seconds in phase grow between two scrapes, its alert is a series, and a run of 65,536 workers is a
scrape of bounded size with the alert's worker still in it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gkd_core.state import RunState
from gkd_core.supervisor.metrics import WORKERS_MAX, SupervisorCounts, families
from gkd_core.telemetry import events as ev

T0 = 1_795_000_000.0


class Once:
    """A collector of the families given (what Scrapes hands the HTTP server)."""

    def __init__(self, made):
        self.made = made

    def collect(self):
        return self.made


def scrape(st: RunState, now: float, counts: SupervisorCounts | None = None) -> tuple[bytes, dict]:
    registry = CollectorRegistry()
    registry.register(Once(families(st, now, counts or SupervisorCounts(events=42))))
    text = generate_latest(registry)
    samples = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return text, samples


def hung_run(workers: int = 3) -> RunState:
    st = RunState()
    st.apply(ev.RunEvent(src="supervisor", state="running", ts=T0, run="r1"))
    for i in range(workers):
        src = f"rollout/{i}"
        st.apply(ev.WorkerEvent(src=src, role="rollout", rank=i, node="n1", pid=100 + i, ts=T0))
        st.apply(ev.PhaseEvent(src=src, phase="sync_weights" if i == 1 else "generate", step=7, ts=T0 + 1))
        st.apply(ev.HeartbeatEvent(src=src, ts=T0 + 2, rss=1 << 30))
    st.apply(ev.SyncEvent(src="driver", sync_id=8, state="started", timeout_s=60.0, pending=["rollout/1"], ts=T0 + 1))
    st.apply(ev.TeacherEvent(src="driver", side="client", sent=10, completed=7, failed=1, in_flight=2, ts=T0 + 2))
    st.apply(ev.GpuEvent(src="agent/n1", node="n1", index=0, util=35.0, mem_used=1 << 30, mem_total=1 << 34,
                         ts=T0 + 2))
    st.apply(ev.AlertEvent(src="supervisor", severity="critical", code="straggler", targets=["rollout/1"],
                           message="rollout/1 has been in sync_weights for 12 s", ts=T0 + 13))
    return st


def test_a_hung_workers_seconds_grow_between_two_scrapes_and_its_alert_is_a_series():
    st = hung_run()
    _, first = scrape(st, T0 + 14)
    _, second = scrape(st, T0 + 19)
    hung = ("gkd_worker_phase_seconds", (("phase", "sync_weights"), ("role", "rollout"), ("worker", "rollout/1")))
    assert first[hung] == 13.0 and second[hung] == 18.0
    assert second[("gkd_alert_active", (("code", "straggler"), ("severity", "critical"), ("target", "rollout/1")))] == 1
    assert second[("gkd_sync_elapsed_seconds", ())] == 18.0 and second[("gkd_sync_timeout_seconds", ())] == 60.0
    assert second[("gkd_teacher_requests_sent_total", ())] == 10
    assert second[("gkd_teacher_requests_in_flight", ())] == 2
    assert second[("gkd_gpu_utilization_ratio", (("gpu", "0"), ("node", "n1")))] == 0.35
    assert second[("gkd_workers", (("phase", "generate"), ("role", "rollout")))] == 2
    assert second[("gkd_run_step", ())] == 7 and second[("gkd_supervisor_events_total", ())] == 42
    assert second[("gkd_worker_heartbeat_age_seconds", (("worker", "rollout/0"),))] == 17.0


def test_65536_workers_are_a_scrape_of_bounded_size_with_the_alerts_worker_in_it():
    st = hung_run(workers=65_536)
    st.apply(ev.AlertEvent(src="supervisor", severity="critical", code="straggler", targets=["rollout/60000"],
                           message="rollout/60000 is late", ts=T0 + 13))
    for i in range(65_536):  # a GPU each, 8 a node
        st.apply(ev.GpuEvent(src=f"agent/n{i // 8}", node=f"n{i // 8}", index=i % 8, util=0.0 if i % 2 else 90.0,
                             mem_used=1 << 30, mem_total=1 << 34, ts=T0 + 2))
    text, samples = scrape(st, T0 + 14)
    assert len(text) < 1 << 20, len(text)
    own = {dict(labels)["worker"] for name, labels in samples if name == "gkd_worker_phase_seconds"}
    assert len(own) == WORKERS_MAX and {"rollout/1", "rollout/60000"} <= own
    # every worker still counted, by role and phase; every GPU, by what its utilisation says
    assert samples[("gkd_workers", (("phase", "generate"), ("role", "rollout")))] == 65_535
    assert samples[("gkd_gpus", (("utilization", "idle"),))] == 32_768
    assert samples[("gkd_gpu_utilization_ratio_mean", ())] == 0.45
    assert len({labels for name, labels in samples if name == "gkd_gpu_utilization_ratio"}) == 256


def test_the_grafana_dashboard_draws_only_series_the_run_exports():
    """grafana/gkd-run.json: every metric its queries name is one a scrape has (a renamed metric would leave a
    panel empty without a word)."""
    import json
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "grafana" / "gkd-run.json").read_text())
    asked = {name for p in dashboard["panels"] for t in p["targets"] for name in re.findall(r"\bgkd_\w+", t["expr"])}
    text, _ = scrape(hung_run(), T0 + 14)  # (a family with no series now is still said, by its HELP and TYPE)
    exported = {f.name + ("_total" if f.type == "counter" else "")
                for f in text_string_to_metric_families(text.decode())}
    assert asked and asked <= exported, sorted(asked - exported)
