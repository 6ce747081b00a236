"""Model factories that fail inside a worker process, for the failure tests of the runtime
and of calibration (``--model failing_models:FACTORY``): rank 1 raises, exits or hangs in
the forward of its last layer once it has run a full step of microbatches."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from pipeplan.runtime.models import example_mlp

FAIL_RANK = 1
CALLS_BEFORE_FAILING = 4  # one step of the tests' 4 microbatches


def _failing(mode: str):
    model, x = example_mlp()
    calls = {"n": 0}

    def hook(module, args, output):
        if not dist.is_initialized() or dist.get_rank() != FAIL_RANK:
            return output
        calls["n"] += 1
        if calls["n"] > CALLS_BEFORE_FAILING:
            if mode == "raise":
                raise RuntimeError("injected failure")
            if mode == "die":
                os._exit(9)
            time.sleep(3600)
        return output

    list(model.children())[-1].register_forward_hook(hook)
    return model, x


def raises():
    return _failing("raise")


def dies():
    return _failing("die")


def hangs():
    return _failing("hang")


def hangs_in_check():
    """Trains on the workers; hangs in the one-process training of ``run --check`` (the only
    forward with gradients outside a process group)."""
    model, x = example_mlp()

    def hook(module, args, output):
        if not dist.is_initialized() and torch.is_grad_enabled():
            time.sleep(3600)
        return output

    list(model.children())[-1].register_forward_hook(hook)
    return model, x


def fails_at_build():
    """Raises while the worker builds it (calibration workers build the model first)."""
    if dist.is_initialized() and dist.get_rank() == FAIL_RANK:
        raise RuntimeError("injected failure")
    return example_mlp()


def exits_at_build():
    if dist.is_initialized() and dist.get_rank() == FAIL_RANK:
        os._exit(3)
    return example_mlp()


__all__ = ["raises", "dies", "hangs", "hangs_in_check", "fails_at_build", "exits_at_build", "torch"]
