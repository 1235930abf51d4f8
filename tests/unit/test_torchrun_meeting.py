"""How the ranks of a torchrun job find one another's run (gkd_core/integrations/torchrun.py); the real torchrun
job is tests/process/test_torchrun_watch.py."""

from __future__ import annotations

import json
import os
import time

import pytest

from gkd_core.integrations import opt_in, torchrun
from gkd_core.vocab import WorkerId

TORCHRUN_ENV = {"TORCHELASTIC_RUN_ID": "none", "RANK": "3", "WORLD_SIZE": "8", "GROUP_RANK": "1",
                "GROUP_WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "node-a", "MASTER_PORT": "29500",
                "TORCHELASTIC_RESTART_COUNT": "2"}


def rank(**kw) -> torchrun.Rank:
    # this process stands for torchrun's agent: a live process whose start time /proc gives
    base = dict(rank=1, world_size=2, node=0, nodes=1, job="none", master="127.0.0.1:29500", restart=0,
                agent=os.getpid())
    return torchrun.Rank(**{**base, **kw})


def test_a_rank_is_read_from_what_torchrun_sets_and_named_by_its_rank():
    got = torchrun.rank_of(TORCHRUN_ENV)
    assert (got.rank, got.world_size, got.node, got.nodes, got.master, got.restart) == (3, 8, 1, 2, "node-a:29500", 2)
    assert str(got).startswith("rank 3 of 8 (node 1 of 2) of torchrun job none")
    assert torchrun.driver_src(TORCHRUN_ENV) == ("rank/3", WorkerId("rank", 3))
    # RANK and WORLD_SIZE alone (set by hand, by another launcher) are not torchrun's: the job's driver
    without = {k: v for k, v in TORCHRUN_ENV.items() if k != "TORCHELASTIC_RUN_ID"}
    assert torchrun.rank_of(without) is None and torchrun.driver_src(without) == ("driver", WorkerId("driver", None))
    assert torchrun.rank_of({**TORCHRUN_ENV, "RANK": "x"}) is None


def test_one_rank_of_a_node_claims_each_round(tmp_path):
    first, second = torchrun.NodeMeeting(rank(rank=8), tmp_path), torchrun.NodeMeeting(rank(rank=9), tmp_path)
    assert first.claim() and not second.claim()
    again = torchrun.NodeMeeting(rank(rank=9, restart=1), tmp_path)  # torchrun started its workers again
    assert again.claim()


def test_a_run_whose_supervisor_is_gone_is_not_joined(tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "endpoints.json").write_text(json.dumps({"supervisor_pid": 2 ** 22 + 1, "ingest": "ipc://x"}))
    meeting = torchrun.NodeMeeting(rank(rank=0), tmp_path)
    meeting.publish(run)
    assert json.loads(meeting.path.read_text())["run_id"] == "r1"
    assert meeting.live_run() is None
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 .* waited 0.2 s for the run its node's first rank starts "
                                           r"\(rank 0 on node 0\) and none came to .*torchrun/.*\.json; this rank is "
                                           "not watched"):
        torchrun.NodeMeeting(rank(), tmp_path).wait_run(0.2)


def test_a_failed_start_of_this_round_ends_the_wait_at_once_and_says_why(tmp_path):
    torchrun.NodeMeeting(rank(rank=0), tmp_path).publish_failure("its supervisor did not start within 30 s")
    t0 = time.monotonic()
    # under the wait a rank has (JOIN_WAIT_S, a minute: within pytest's timeout), and done before it ran out
    with pytest.raises(RuntimeError, match=r"rank 0 of 2 .* could not start the run \(its supervisor did not start "
                                           r"within 30 s\); rank 1 of 2 .* is not watched either"):
        torchrun.NodeMeeting(rank(), tmp_path).wait_run(opt_in.JOIN_WAIT_S)
    assert time.monotonic() - t0 < opt_in.JOIN_WAIT_S
    # a failure of an earlier round is not this round's: its rank 0 may start the run yet
    with pytest.raises(RuntimeError, match="waited 0.1 s"):
        torchrun.NodeMeeting(rank(restart=1), tmp_path).wait_run(0.1)


def test_the_meetings_of_agents_that_are_gone_are_forgotten(tmp_path):
    meeting = torchrun.NodeMeeting(rank(rank=0), tmp_path)
    meeting.claim()
    gone = [meeting.folder / f"{meeting.machine}-{os.getpid()}-1.json",  # this pid, born at another time
            meeting.folder / f"{meeting.machine}-{2 ** 22 + 1}-5.r0.claim"]  # no such process
    other_machine = meeting.folder / f"elsewhere-0000-{2 ** 22 + 1}-5.json"  # not ours to judge
    for p in (*gone, other_machine):
        p.write_text("{}")
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    meeting.publish(run)
    assert sorted(p.name for p in meeting.folder.iterdir()) == sorted(
        [meeting.path.name, f"{meeting.key}.r0.claim", other_machine.name])
