"""The command line: parsing and printing only (``app``: the parser and the pipeline commands;
``dynamic``, ``shard``: their command families; ``report``, ``progress``: what is printed)."""

import os

# The planners' and the simulator's GEMMs are small (a policy's rows, a batch of plans): BLAS
# threads only spin on them, and on a busy machine they cost several times the work (automap-
# infer's Q-network: 16 ms a call with OpenBLAS's threads on 2 cores, 1.7 ms with one). Set
# before numpy loads; a value the user exported is kept. torch keeps its own threads.
for _name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

from .app import build_parser, main  # noqa: E402

__all__ = ["build_parser", "main"]
