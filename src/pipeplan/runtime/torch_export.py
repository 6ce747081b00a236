"""torch.export, quietly, and the names of its ops: what the op-level graph (``aten_graph``)
and the sharding IR (``sharding.program``) read models through."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings

import torch
from torch import fx, nn


def op_name(node: fx.Node) -> str:
    """``addmm`` for ``aten.addmm.default``; the target's name for anything else."""
    return getattr(node.target, "_opname", None) or getattr(node.target, "__name__", str(node.target))


def quiet_export(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> "torch.export.ExportedProgram":
    """Export and decompose to core ATen (training mode as the module is), without torch's
    warnings, log lines and prints (on a failure torch.export prints the partial graph to
    stderr and its fake tensors log the stack trace as an error; the exception says enough)."""
    disabled = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), \
                contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return torch.export.export(module, tuple(inputs)).run_decompositions()
    finally:
        logging.disable(disabled)
