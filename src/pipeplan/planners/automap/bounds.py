"""A lower bound of a synchronous pipeline's iteration time (1F1B or GPipe, replicas
splitting each microbatch by speed), from per-stage figures, for many plans at once.

For every stage k (``fwd``/``bwd``: one microbatch's pass on the stage's devices together,
``xfer``: one microbatch's activation transfer across boundary k, ``allreduce``: the
stage's gradient all-reduce):

- its first forward waits for microbatch 0's forwards and transfers through the stages
  before it: ``sum_{j<k} (fwd_j + xfer_j)``;
- its devices then run all M forwards and backwards: ``M (fwd_k + bwd_k)``;
- after its last backward, either its all-reduce runs (the next action of its program) or
  that microbatch's gradient goes back through the stages before it:
  ``max(allreduce_k, sum_{j<k} (bwd_j + xfer_j))``;

and every boundary's channel carries M transfers each way: ``M xfer_k``. The iteration is at
least the largest of these. Latency, optimizer steps, per-call overheads and contention only
add time; tests check the bound against the simulator on random plans.
"""

from __future__ import annotations

import numpy as np


def pipeline_lower_bound(fwd: np.ndarray, bwd: np.ndarray, xfer: np.ndarray, allreduce: np.ndarray,
                         microbatches: int) -> np.ndarray:
    """Rows of plans: ``fwd``, ``bwd``, ``allreduce`` (T, K); ``xfer`` (T, K-1)."""
    pad = np.concatenate([np.zeros((len(fwd), 1)), xfer], axis=1)  # transfer into stage k
    into_f = np.cumsum(fwd + pad, axis=1) - fwd
    into_b = np.cumsum(bwd + pad, axis=1) - bwd
    stage = into_f + microbatches * (fwd + bwd) + np.maximum(allreduce, into_b)
    channel = microbatches * xfer.max(axis=1) if xfer.shape[1] else 0.0
    return np.maximum(stage.max(axis=1), channel)
