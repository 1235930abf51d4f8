"""The vLLM rollout engine (the `vllm` extra): refused with a clear message where vLLM is absent.

vLLM 0.33 pins torch 2.14 and transformers < 5.21, so it cannot share an environment with the
CPU torch of a small machine; the torch engine is the default and runs everywhere.
"""

from __future__ import annotations

import importlib.util


class EngineUnavailable(RuntimeError):
    pass


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable(
            "rollout.engine=vllm, but vLLM is not installed in this environment; install the extra on a GPU "
            "node (`pip install -e .[vllm]`, which brings its own CUDA torch) or use rollout.engine=torch"
        )
    raise EngineUnavailable(
        "rollout.engine=vllm: vLLM is installed, but this version of gkd-tui drives rollouts with the torch "
        "engine only; use rollout.engine=torch"
    )
