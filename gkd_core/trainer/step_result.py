"""What the student's ``train_step`` and ``evaluate`` return to the driver: typed, so that a key
misspelled on either side is an error where it is made, not a metric that silently reads None."""

from __future__ import annotations

import msgspec


class Shape(msgspec.Struct, kw_only=True):
    """What the completions looked like: mean length (EOS included), the share that reached EOS."""

    completion_len: float
    eos_share: float


class StepResult(msgspec.Struct, kw_only=True):
    loss: float
    kl: float  # mean KL(teacher‖student) over the step's completion tokens
    tokens: int
    sample_agreement: float  # the share of tokens where the student's argmax is the teacher's
    shape: Shape
    grad_norm: float  # before clipping
    skipped: bool  # the loss or the gradient norm was not finite: the weights stayed as they were
    weights_finite: bool  # after the update (False: they must not reach the rollouts)


class EvalResult(msgspec.Struct, kw_only=True):
    divergence: float  # the configured loss on the held-out prompts
    kl: float
    agreement: float
    shape: Shape
