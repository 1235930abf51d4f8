"""The run configuration: YAML plus dotted ``key=value`` overrides, typed and validated.

Nothing starts on an invalid config: a bad key or value raises ``ConfigError`` naming the key
path, the value, where it came from (file or command line) and the nearest valid key.
The defaults of every field are the embedded tiny CPU demo, so ``load_config(None)`` is the
config that ``gkd-tui launch`` runs with no file.

- ``schema``: the sections and keys, with their defaults;
- ``loading``: YAML and overrides to a checked ``Config``;
- ``changes``: a config written out, made absolute, digested, shrunk, compared.
"""

from gkd_core.config.changes import absolute_paths, diff, digest, shrink, to_yaml
from gkd_core.config.loading import ConfigError, ConfigWarning, apply_overrides, load_config, parse_override
from gkd_core.config.schema import (
    ActorConfig,
    AgentConfig,
    Config,
    DataConfig,
    FaultConfig,
    ModelConfig,
    RecoveryConfig,
    RolloutConfig,
    ShrinkRule,
    TeacherConfig,
    TelemetryConfig,
    TrainerConfig,
)

__all__ = [
    "absolute_paths", "diff", "digest", "shrink", "to_yaml", "ConfigError", "ConfigWarning", "apply_overrides",
    "load_config", "parse_override", "ActorConfig", "AgentConfig", "Config", "DataConfig", "FaultConfig", "ModelConfig",
    "RecoveryConfig", "RolloutConfig", "ShrinkRule", "TeacherConfig", "TelemetryConfig", "TrainerConfig",
]
