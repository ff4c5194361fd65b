"""The values live replay gives the tensors it makes (:class:`nbox_replay.live.ops.TensorPool`).

The execution trace records a tensor's shape, strides and dtype, never its values, so a tensor no replayed operator
produced (a parameter, an optimizer's state, the batch, a saved statistic) is made up. An operator's speed must not
depend on the made-up values more than on the real ones; most kernels do not care, but a few do, and a chain of
in-place updates carries the values from one repetition into the next. The rules, by what the tensor is:

* integer and bool tensors (and 1-byte floats) hold zeros: index 0 is always valid for ``embedding``,
  ``index_select``, ``gather``, ``nll_loss`` targets, ...;
* a floating-point tensor a domain-restricted operator reads (:data:`POSITIVE_INPUTS`: ``sqrt``, ``rsqrt``,
  ``log``, a power, a fused Adam's second moments and steps) holds uniform values in :data:`POSITIVE_RANGE`. The
  real run's are never negative (Adam's ``exp_avg_sq`` is a mean of squares, which the trace shows as a tensor
  first met by ``mul_`` and updated in place by ``addcmul_``; the tensor id leads the rule back to where the replay
  makes it). On a negative value the kernel computes a NaN, which the CPU's vectorized math does on a slow path:
  with ``torch.optim.AdamW`` the optimizer's ``aten::sqrt`` made a GPT-2-class model's live replay compute far more
  than its recording;
* a 0-dimensional floating-point tensor holds 1: a Python number an operator received is recorded as such a
  tensor (a "wrapped number": Adam's ``beta2`` in ``exp_avg_sq.mul_(beta2)``, its bias correction in a ``div``,
  its ``eps`` in an ``add_``, AdamW's weight-decay factor). Made up in [-1, 1), a negative ``beta2`` turned every
  second moment negative before its ``sqrt``, a factor below 1 in magnitude shrank the parameters at every
  repetition toward denormals (a slow path of every kernel), and one near zero made a division overflow; 1 keeps
  such chains where they are. An argument named ``found_inf`` (:data:`ZERO_ARGUMENTS`: the gradient scaler's flag
  that makes a fused optimizer skip its step) holds 0, so the step runs as in the real run;
* any other floating-point tensor holds uniform values in [-1, 1): zero-mean, never NaN or denormal.
"""

from __future__ import annotations

import torch

__all__ = ["POSITIVE", "POSITIVE_INPUTS", "POSITIVE_RANGE", "ZERO", "ZERO_ARGUMENTS", "argument_rule", "fill"]

POSITIVE, ZERO = "positive", "zero"
#: Domain-restricted ``aten`` operators (the name without its namespace, a ``_foreach_`` prefix and an in-place
#: ``_`` suffix) -> the schema arguments whose floating-point tensors must not be negative.
POSITIVE_INPUTS: dict[str, frozenset[str]] = {
    **{name: frozenset({"self"}) for name in ("sqrt", "rsqrt", "log", "log2", "log10", "pow")},
    **{name: frozenset({"exp_avg_sqs", "max_exp_avg_sqs", "state_steps"}) for name in ("_fused_adam", "_fused_adamw")},
}
#: Schema arguments whose tensors hold 0, whatever the operator.
ZERO_ARGUMENTS = frozenset({"found_inf"})
#: The values of a tensor made for a :data:`POSITIVE_INPUTS` argument: positive, normal, away from zero.
POSITIVE_RANGE = (0.5, 1.0)


def _base_name(qualified: str) -> str:
    """``aten::_foreach_sqrt_`` -> ``sqrt`` (the :data:`POSITIVE_INPUTS` key)."""
    return (qualified.partition("::")[2] or qualified).removeprefix("_foreach_").removesuffix("_")


def argument_rule(op_name: str, arg_name: str) -> str | None:
    """:data:`ZERO`, :data:`POSITIVE` or None (the default rules) for argument ``arg_name`` of operator
    ``op_name`` (``aten::sqrt``)."""
    if arg_name in ZERO_ARGUMENTS:
        return ZERO
    return POSITIVE if arg_name in POSITIVE_INPUTS.get(_base_name(op_name), ()) else None


def fill(base: torch.Tensor, scalar: bool, rule: str | None) -> None:
    """Fill ``base``, the storage of a made tensor (``scalar``: a 0-dimensional one), in place by the rules of the
    module docstring, ``rule`` being its :func:`argument_rule`."""
    if not base.dtype.is_floating_point or base.dtype.itemsize == 1 or rule == ZERO:
        base.zero_()
    elif rule == POSITIVE:
        base.uniform_(*POSITIVE_RANGE)
    elif scalar:
        base.fill_(1.0)
    else:
        base.uniform_(-1.0, 1.0)
