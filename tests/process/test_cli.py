"""gkd-tui's command line as a user types it: help, errors that say what to do, the run argument."""

import json

import pytest
from conftest import gkd_tui


def test_help_lists_the_commands(gkd_home):
    r = gkd_tui("--help", home=gkd_home)
    assert r.returncode == 0
    for cmd in ("launch", "attach", "status", "stop", "restart", "cancel", "dump-stacks"):
        assert cmd in r.stdout


RUN_COMMANDS = ("attach", "replay", "status", "stop", "restart", "bundle")  # the run is their positional


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_a_command_takes_its_run_as_RUN_or_as_run_option(command):
    from gkd_tui.cli import _parser

    p = _parser()
    assert p.parse_args([command, "r1"]).run == p.parse_args([command, "--run", "r1"]).run == "r1"
    assert p.parse_args([command, "r1", "--run", "r1"]).run == "r1"  # the same twice is no conflict
    assert p.parse_args([command]).run is None  # the latest run


def test_status_run_and_status_option_run_reach_the_same_run(gkd_home, capsys):
    from gkd_tui import cli

    run = gkd_home / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "events.jsonl").write_bytes(b"")
    said = []
    for argv in (["status", "r1"], ["status", "--run", "r1"], ["status", "--timeout", "0.2", "--run", str(run)]):
        assert cli.main(argv) == 3  # no supervisor ever started there
        said.append(capsys.readouterr().err)
    assert said[0] == said[1] == said[2], said
    assert f"(run directory {run.resolve()})" in said[0] and "endpoints.json does not exist" in said[0]
    # the commands whose positional is the workers take the run as --run
    assert cli.main(["cancel", "rollout/1", "--run", "r1"]) == 3
    assert cli.main(["dump-stacks", "--run", "r1", "rollout/0", "rollout/1"]) == 3
    assert capsys.readouterr().err.count(f"(run directory {run.resolve()})") == 2


@pytest.mark.parametrize("argv, said", [
    (["status", "r1", "--run", "r2"], "'r1' and --run 'r2'"),
    (["bundle", "--run", "r2", "r1"], "--run 'r2' and 'r1'"),
    (["cancel", "sync", "--run", "r1", "--run", "r2"], "--run 'r1' and --run 'r2'"),
])
def test_a_run_given_twice_differently_is_an_error_that_says_both(argv, said, capsys):
    from gkd_tui import cli

    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and f"the run is given twice, differently: {said}" in err, err
    assert err.startswith(f"usage: gkd-tui {argv[0]} ")  # the command's own usage, not the program's


def test_status_without_a_run_says_where_it_looked(gkd_home):
    r = gkd_tui("status", "--json", home=gkd_home)
    assert r.returncode == 3
    assert str(gkd_home / "runs" / "latest") in r.stderr and "gkd-tui launch" in r.stderr
    assert r.stdout == ""


def test_replay_of_a_file_that_holds_no_events_says_so_and_opens_nothing(gkd_home, tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("# my notes\n\nnot a run's log\n")
    r = gkd_tui("replay", str(notes), home=gkd_home)
    assert r.returncode == 2 and r.stdout == ""  # no dashboard drawn
    assert f"no events in {notes}" in r.stderr and "line 1" in r.stderr and "events.jsonl" in r.stderr


@pytest.mark.slow
def test_status_of_a_live_run_and_of_a_dead_one(start_supervisor, gkd_home):
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    sup.wait_driver()
    r = gkd_tui("status", "--json", home=gkd_home)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["state"]["state"] == "running" and st["state"]["workers"]["driver"]["pid"] > 0
    assert st["seq"] >= 3 and st["supervisor"]["driver_connected"]
    text = gkd_tui("status", home=gkd_home)
    assert text.returncode == 0 and "running" in text.stdout and "driver" in text.stdout
    sup.kill()
    r = gkd_tui("status", "--timeout", "0.3", home=gkd_home)
    assert r.returncode == 3 and str(sup.run) in r.stderr and "replay" in r.stderr


def test_bundle_has_what_a_bug_report_needs_and_never_the_keys(start_supervisor, tmp_path):
    import tarfile

    sup = start_supervisor("trainer.total_steps=100000")
    # a note on the record (the `note` op: one Struct, one handler) is what the report lists as tried; an
    # empty one is refused in one line, naming the argument
    r = gkd_tui("note", "--run", str(sup.run), "tried", "a smaller micro-batch", home=sup.home)
    assert r.returncode == 0 and "tried a smaller micro-batch" in r.stdout, r.stderr
    r = gkd_tui("note", "--run", str(sup.run), "", home=sup.home)
    assert r.returncode == 1 and "argument 'text' must be 1 to 2000 characters" in r.stderr, r.stderr
    out = tmp_path / "b.tar.gz"
    r = gkd_tui("bundle", str(sup.run), "-o", str(out), home=sup.home)
    assert r.returncode == 0, r.stderr
    names = tarfile.open(out).getnames()
    summary = tarfile.open(out).extractfile(next(n for n in names if n.endswith("/summary.md"))).read().decode()
    tried = summary.split("## What was tried", 1)[1].split("\n## ", 1)[0]
    assert "`note`" in tried and "tried a smaller micro-batch" in tried and "failed" in tried, tried
    assert any(n.endswith("/events.jsonl") for n in names) and any(n.endswith("/config.yaml") for n in names)
    status = next(n for n in names if n.endswith("/status.txt"))
    assert b"running" in tarfile.open(out).extractfile(status).read()  # the live state, from a snapshot
    assert not any("/keys/" in n or n.endswith(".key_secret") or "/checkpoints/" in n for n in names)
    assert (out.stat().st_mode & 0o777) == 0o600
