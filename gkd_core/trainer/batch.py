"""A step's prompts on their way through the rollouts: out for generation (``Pending``), then back as
completions (``Batch``), with how their rows are padded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Pending:
    """Prompts out for generation: the Ray calls and how their rows are padded, and what was sent, to send it
    again (a rollout that was generating it died and was replaced: ``Driver.resend``)."""

    refs: dict
    left_pad: np.ndarray  # [B], in the order the rollouts' parts come back
    width: int  # the prompts' padded width: every completion starts there
    position: int  # the data position once these prompts are taken
    rows: list[list[int]]  # the prompts' token ids, unpadded
    step: int
    seed: int
    greedy: bool


@dataclass
class Batch:
    seqs: np.ndarray  # [B, width + new]
    left_pad: np.ndarray
    width: int
    position: int
    gen_s: float  # the slowest rollout's generation time
