"""supervisor/unattended.settings: the command line's webhooks and metrics port over the user's own
GKD_HOME/unattended.yaml; a file of the wrong shape is an error that names it and its keys."""

from __future__ import annotations

import pytest

from gkd_core.supervisor.unattended_settings import UnattendedConfig, settings


def test_the_command_lines_settings_join_the_users_file(tmp_path):
    assert settings(tmp_path, [], [], None, None) == UnattendedConfig()  # neither: nothing unattended
    assert not settings(tmp_path, [], [], None, None)
    (tmp_path / "unattended.yaml").write_text("notify:\n  urls: [https://hooks.example/T/B/secret]\n  quiet_s: 60\n"
                                              "metrics:\n  port: 9464\n")
    got = settings(tmp_path, ["http://127.0.0.1:9/hook"], ["cat"], None, None)
    assert got == UnattendedConfig(notify_urls=["https://hooks.example/T/B/secret", "http://127.0.0.1:9/hook"],
                                   notify_commands=["cat"], quiet_s=60.0, metrics_port=9464)
    assert settings(tmp_path, [], [], 0, "127.0.0.2").metrics_port == 0  # the command line's port wins, even 0


def test_a_settings_file_of_the_wrong_shape_says_where_and_what(tmp_path):
    (tmp_path / "unattended.yaml").write_text("notify:\n  url: https://hooks.example/x\n")
    with pytest.raises(ValueError, match=r"unattended\.yaml: .*url.*; its keys are notify\.urls"):
        settings(tmp_path, [], [], None, None)


def test_restart_on_takes_codes_one_or_a_list_at_a_time_and_refuses_a_code_that_is_no_alerts(tmp_path):
    got = settings(tmp_path, [], [], None, None, ["deadlock,heartbeat_stale", "collective_stuck"], 30.0, 2)
    assert (got.restart_on, got.restart_grace_s, got.restarts_per_hour) == (
        ["deadlock", "heartbeat_stale", "collective_stuck"], 30.0, 2)
    assert got  # a restart policy alone is something to do unattended
    with pytest.raises(ValueError, match=r"--restart-on: 'deadlok' is not an alert's code \(did you mean deadlock\?\)"):
        settings(tmp_path, [], [], None, None, ["deadlok"])
    with pytest.raises(ValueError, match=r"--restart-budget 0: must be at least 1"):
        settings(tmp_path, [], [], None, None, ["deadlock"], None, 0)
