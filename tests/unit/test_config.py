from pathlib import Path

import pytest

from gkd_core import config as C

ROOT = Path(__file__).resolve().parents[2]


def test_embedded_default_is_valid_and_equals_the_example():
    assert C.load_config(None) == C.load_config(ROOT / "examples" / "tiny_cpu.yaml")


def test_overrides_are_typed():
    cfg = C.load_config(None, ["trainer.total_steps=7", "actor.loss=reverse_kl", "telemetry.stall_s=2.5"])
    assert cfg.trainer.total_steps == 7 and cfg.actor.loss == "reverse_kl" and cfg.telemetry.stall_s == 2.5


def test_unknown_key_names_path_value_source_and_nearest(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("trainer:\n  total_step: 10\n")
    with pytest.raises(C.ConfigError) as e:
        C.load_config(f)
    msg = str(e.value)
    assert "trainer.total_step" in msg and "10" in msg and str(f) in msg and "trainer.total_steps" in msg


def test_bad_value_in_override_names_the_override():
    with pytest.raises(C.ConfigError) as e:
        C.load_config(None, ["trainer.total_steps=many"])
    msg = str(e.value)
    assert "trainer.total_steps" in msg and "'many'" in msg and "override" in msg


def test_bad_choice_and_semantic_checks():
    with pytest.raises(C.ConfigError, match="actor.loss"):
        C.load_config(None, ["actor.loss=kl_both_ways"])
    with pytest.raises(C.ConfigError, match="actor.beta"):
        C.load_config(None, ["actor.beta=1.5"])
    with pytest.raises(C.ConfigError, match="not of the form"):
        C.load_config(None, ["nonsense"])


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(C.ConfigError, match="does not exist"):
        C.load_config(tmp_path / "nope.yaml")
    f = tmp_path / "list.yaml"
    f.write_text("- a\n- b\n")
    with pytest.raises(C.ConfigError, match="mapping"):
        C.load_config(f)


def test_shrink_halves_with_floors_and_diff_lists_changes():
    cfg = C.load_config(None, ["rollout.n_workers=4", "data.batch_size=5"])
    small, changes = C.shrink(cfg)
    assert small.rollout.n_workers == 2 and small.data.batch_size == 4  # floor 4
    assert ("rollout.n_workers", 4, 2) in changes
    assert sorted(C.diff(cfg, small)) == sorted(changes)
    tiny = C.load_config(None, ["rollout.n_workers=1"])
    assert C.shrink(tiny)[0].rollout.n_workers == 1


def test_digest_is_stable_and_sensitive():
    a, b = C.load_config(None), C.load_config(None, ["trainer.total_steps=61"])
    assert C.digest(a) == C.digest(C.load_config(None)) != C.digest(b)


def test_a_retired_key_of_an_older_config_loads_with_a_warning_and_is_not_written_again(tmp_path):
    old = tmp_path / "config.yaml"
    old.write_text("model:\n  name: tiny-student\n  n_layer: 3\nteacher:\n  model: tiny-teacher\n")
    with pytest.warns(C.ConfigWarning) as said:
        cfg = C.load_config(old)
    assert cfg.model.n_layer == 3
    assert [str(w.message) for w in said] == [
        f"{old}: 'model.name' ('tiny-student') is read by nothing and ignored (model.path says which student): "
        "remove it",
        f"{old}: 'teacher.model' ('tiny-teacher') is read by nothing and ignored (teacher.path says which teacher): "
        "remove it"]
    assert "tiny-student" not in C.to_yaml(cfg) and "tiny-teacher" not in C.to_yaml(cfg)
    with pytest.raises(C.ConfigError, match="unknown key 'model.nme'"):  # other unknown keys are still refused
        C.load_config(None, ["model.nme=x"])


def test_a_long_value_outside_a_choice_is_refused_in_one_short_line():
    """Found by the fuzz test: msgspec quotes the bad value whole in its reason; the error is cut like the value."""
    with pytest.raises(C.ConfigError) as e:
        C.load_config(None, ["data.truncation='" + "9" * 5000 + "'"])
    assert "bad value for 'data.truncation'" in str(e.value) and "Invalid enum value" in str(e.value)
    assert len(str(e.value)) < 500


def test_a_slow_sync_part_fault_names_a_part_of_the_sync_and_one_without_its_part_is_refused():
    from typing import get_args, get_type_hints

    from gkd_core.config.schema import FaultConfig
    from gkd_core.vocab import TRAINER_SYNC_PARTS

    assert set(get_args(get_type_hints(FaultConfig)["part"])) - {""} == set(TRAINER_SYNC_PARTS)
    with pytest.raises(C.ConfigError) as e:
        C.load_config(None, ["faults=[{kind: slow_sync_part, target: rollout/1, step: 2, seconds: 5}]"])
    assert "a slow_sync_part fault needs its part: one of gather, broadcast, load" in str(e.value)
    cfg = C.load_config(None, ["faults=[{kind: slow_sync_part, target: rollout/1, step: 2, part: load, seconds: 5}]"])
    assert cfg.faults[0].part == "load"
