"""Device kinds: default memory and speed relative to the reference device (V100).

Speeds are ratios of peak FP32 throughput from the vendors' data sheets (V100 SXM2 15.7
TFLOP/s; GTX 1080 Ti 11.3; A100 19.5; P100 10.6; T4 8.1; H100 SXM 67) — a first-order
figure; measure with ``pipeplan calibrate`` where it matters.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PipeplanError


@dataclass(frozen=True)
class Kind:
    name: str
    memory: float
    speed: float
    note: str


_GiB = 2.0**30
KINDS: dict[str, Kind] = {k.name.lower(): k for k in (
    Kind("V100", 32 * _GiB, 1.0, "NVIDIA Tesla V100 32 GB, 15.7 TFLOP/s FP32 (reference)"),
    Kind("1080Ti", 11 * _GiB, 11.3 / 15.7, "NVIDIA GTX 1080 Ti 11 GB, 11.3 TFLOP/s FP32"),
    Kind("P100", 16 * _GiB, 10.6 / 15.7, "NVIDIA Tesla P100 16 GB, 10.6 TFLOP/s FP32"),
    Kind("T4", 16 * _GiB, 8.1 / 15.7, "NVIDIA T4 16 GB, 8.1 TFLOP/s FP32"),
    Kind("A100", 80 * _GiB, 19.5 / 15.7, "NVIDIA A100 80 GB, 19.5 TFLOP/s FP32"),
    Kind("H100", 80 * _GiB, 67.0 / 15.7, "NVIDIA H100 SXM 80 GB, 67 TFLOP/s FP32"),
    Kind("GPU", 32 * _GiB, 1.0, "a generic device equal to the reference"),
    Kind("CPU", 8 * _GiB, 1.0, "a CPU worker process (speed relative to the profile's process; "
         "measure it with pipeplan calibrate)"),
)}


def kind(name: str) -> Kind:
    k = KINDS.get(name.lower())
    if k is None:
        raise PipeplanError(f"unknown device kind {name!r} (known: {', '.join(x.name for x in KINDS.values())})")
    return k
