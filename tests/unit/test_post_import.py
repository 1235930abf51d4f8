"""A module patched once it is imported, by whoever imports it (integrations/post_import.py)."""

from __future__ import annotations

import importlib
import sys

from gkd_core.integrations.post_import import when_imported


def test_a_hook_runs_after_the_modules_own_code_at_its_import_and_at_once_when_already_imported(tmp_path,
                                                                                               monkeypatch, capfd):
    (tmp_path / "gkd_probe_later.py").write_text("class Manager:\n    def call(self):\n        return 'theirs'\n")
    (tmp_path / "gkd_probe_broken_hook.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def patch(module):
        seen.append(module.__name__)
        module.Manager.call = lambda self: "patched"

    when_imported("gkd_probe_later", patch)
    assert seen == [] and "gkd_probe_later" not in sys.modules  # nothing imported by asking
    module = importlib.import_module("gkd_probe_later")
    assert seen == ["gkd_probe_later"] and module.Manager().call() == "patched"
    when_imported("gkd_probe_later", lambda m: seen.append("again"))  # already imported: at once
    assert seen == ["gkd_probe_later", "again"]

    def broken(module):
        raise RuntimeError("a bug of ours")

    when_imported("gkd_probe_broken_hook", broken)
    assert importlib.import_module("gkd_probe_broken_hook").VALUE == 1  # the import goes on
    said = capfd.readouterr().err
    assert "patching gkd_probe_broken_hook after its import failed (RuntimeError: a bug of ours)" in said
    for name in ("gkd_probe_later", "gkd_probe_broken_hook"):
        sys.modules.pop(name, None)
