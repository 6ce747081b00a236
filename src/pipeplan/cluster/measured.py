"""Decoder-layer times measured on a device kind's GPU, where this checkout has them.

``benchmarks/gpu/layer_timing.py`` times whole decoder layers (forward, backward, recomputed
forward, attention core, optimizer step) on the GPU it runs on and writes
``benchmarks/results/gpu/layer_timing_<gpu>.json``; its ``"gpu"`` names the GPU as CUDA does,
which ``gpu_kind`` maps to a kind of ``kinds.py`` (``NVIDIA H100 80GB HBM3``: H100-SXM;
``NVIDIA A100-SXM4-80GB``: A100-80GB; GPUs of no kind here, an H200 or a PCIe card: none).
The results folder is the source checkout's (``src/pipeplan/../../benchmarks``); an installed
wheel has none, and then nothing is measured. Pure Python: reads JSON, imports no torch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

#: benchmarks/results/gpu of the checkout this package is in (absent in an installed wheel)
RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "gpu"
PATTERN = "layer_timing_*.json"
#: (CUDA device name, case-insensitive regex) -> kind; SXM boards only, as the kinds are
GPU_KINDS = ((r"\bH100\b.*\b(HBM3|SXM\d?)\b", "H100-SXM"),
             (r"\bH800\b", "H800"),
             (r"\bA100-SXM\d?-80GB\b", "A100-80GB"),
             (r"\bA100-SXM\d?-40GB\b", "A100-40GB"))


def gpu_kind(gpu: str) -> str | None:
    """The device kind a CUDA device name is, or None when it is none of ours."""
    return next((kind for pattern, kind in GPU_KINDS if re.search(pattern, gpu, re.IGNORECASE)), None)


def layer_timings(kind_name: str, root: Path | None = None) -> list[dict] | None:
    """The measured rows (layer_timing.py's) of every results file in ``root`` (default: the
    checkout's benchmarks/results/gpu) whose GPU is of kind ``kind_name`` (case-insensitive);
    None when there are none, or no results folder. Files that are not such results are passed over."""
    folder = RESULTS if root is None else Path(root)
    if not folder.is_dir():
        return None
    rows: list[dict] = []
    for path in sorted(folder.glob(PATTERN)):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not (isinstance(data, dict) and isinstance(data.get("gpu"), str) and isinstance(data.get("rows"), list)):
            continue
        kind = gpu_kind(data["gpu"])
        if kind is not None and kind.lower() == kind_name.lower():
            rows += data["rows"]
    return rows or None


def is_measured(kind_name: str, root: Path | None = None) -> bool:
    """Whether decoder-layer times measured on a GPU of this kind are at hand."""
    return layer_timings(kind_name, root) is not None
