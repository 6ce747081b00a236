"""Device kinds: default memory and speed relative to the reference device (V100).

Speeds are ratios of peak FP32 throughput from the vendors' data sheets (V100 SXM2 15.7
TFLOP/s; GTX 1080 Ti 11.3; A100 19.5; P100 10.6; T4 8.1; H100 SXM 67) — a first-order
figure; measure with ``pipeplan calibrate`` where it matters.

The GPUs LLMs train on also carry their dense bf16 tensor-core peak and HBM bandwidth
(NVIDIA's data sheets: A100 312 TFLOP/s, 1,555 GB/s with 40 GB, 2,039 GB/s with 80 GB;
H100 SXM 989 TFLOP/s, 3,350 GB/s), which the transformer cost model prices bf16 work with.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PipeplanError
from .model import Resource


@dataclass(frozen=True)
class Kind:
    name: str
    memory: float
    speed: float
    note: str
    resources: tuple[Resource, ...] = ()
    bf16_flops: float = 0.0  # dense bf16 tensor-core peak, FLOP/s (0: not a kind LLMs train on)
    hbm_bytes_per_s: float = 0.0  # memory bandwidth (0: unknown)
    #: a bf16 GEMM of F FLOPs takes F / (bf16_flops x gemm_efficiency) + gemm_overhead_s
    #: (llm/costs.py; 0: not measured for this kind)
    gemm_efficiency: float = 0.0
    gemm_overhead_s: float = 0.0
    #: what the bf16 rates rest on until a whole layer is timed on one (``cluster.measured``)
    rates_from: str = ""
    #: dense FP8 tensor-core peak, FLOP/s (0: no FP8 tensor cores)
    fp8_flops: float = 0.0

    @property
    def memory_reserve(self) -> float:
        """Bytes of a device's memory no plan may use (``MEMORY_RESERVE``); 0 for the seed
        papers' kinds, whose papers planned with the whole memory."""
        if self.bf16_flops <= 0:
            return 0.0
        context, nccl, fragmentation = MEMORY_RESERVE
        return context + nccl + fragmentation * self.memory


# Mobile devices of resalloc.txt §VI, as two resources each (CPU, GPU). Forward speeds are
# peak FP32 throughput relative to the V100's 15.7 TFLOP/s, from the vendors' figures:
# i7-10750H 6 cores x 2.6 GHz x 32 FLOP/cycle = 0.50 TFLOP/s; GTX 1650 (laptop) 1024 cores x
# 1.56 GHz x 2 = 3.2; i5-1135G7 4 x 2.4 GHz x 32 = 0.31; Iris Xe G7 80 EU x 8 x 2 x 1.3 GHz =
# 1.66; Raspberry Pi 4B Cortex-A72 4 x 1.5 GHz x 8 = 0.048. Backward: a GPU keeps the
# profile's forward/backward ratio (both measured on GPUs); a CPU's backward is relatively
# slower: measured on this project's machine (pipeplan profile example:cnn, conv layers),
# backward/forward = 1.72 on the CPU against 0.87 in PipeDream's V100 AlexNet profile, so a
# CPU's backward speed is 0.51 x its forward speed.
CPU_BWD = 0.87 / 1.72


def _cpu(name: str, tflops: float) -> Resource:
    return Resource(name, tflops / 15.7, tflops / 15.7 * CPU_BWD)


def _gpu(name: str, tflops: float) -> Resource:
    return Resource(name, tflops / 15.7, tflops / 15.7)


_GiB = 2.0**30
#: What a training process on an A100/H100 holds outside the plan's tensors (docs/memory.md,
#: "Reserve"), assumptions until measured: the CUDA context and its kernels' modules (0.75
#: GiB with lazy loading), NCCL's buffers and communicators for the TP, DP and PP groups (1.25
#: GiB) and the caching allocator's fragmentation (3% of the memory). ``--memory-reserve``
#: overrides the sum.
MEMORY_RESERVE = (0.75 * 2.0**30, 1.25 * 2.0**30, 0.03)
#: (efficiency, overhead) of bf16 GEMMs on an H100 SXM, fitted (least relative squares) to the
#: 512 transformer-layer GEMMs benchmarks/gpu/gemm_efficiency.py timed on one
#: (benchmarks/results/gpu/, docs/llm.md): t = F / (989e12 x 0.708) + 17 us
H100_GEMM = (0.708, 17e-6)
#: A100 (no GPU of this kind was lent): the efficiency that makes one 22B-model layer (hidden
#: 6144, 64 heads, microbatch 4, tensor-parallel 8) take Korthikanti et al. 2022 Table 4's
#: measured 7.7 + 11.9 ms on a DGX A100, its backward's tensor-parallel all-reduces hidden
#: behind the weight-gradient GEMMs as Megatron runs them (tests/test_llm_costs.py: the other
#: four rows are predictions, each within 2%), the H100's overhead assumed
A100_GEMM = (0.669, 17e-6)
A100_RATES = "a published layer timing (Korthikanti et al. 2022, Table 4), no GPU of this kind timed here"
KINDS: dict[str, Kind] = {k.name.lower(): k for k in (
    Kind("V100", 32 * _GiB, 1.0, "NVIDIA Tesla V100 32 GB, 15.7 TFLOP/s FP32 (reference)"),
    Kind("1080Ti", 11 * _GiB, 11.3 / 15.7, "NVIDIA GTX 1080 Ti 11 GB, 11.3 TFLOP/s FP32"),
    Kind("P100", 16 * _GiB, 10.6 / 15.7, "NVIDIA Tesla P100 16 GB, 10.6 TFLOP/s FP32"),
    Kind("T4", 16 * _GiB, 8.1 / 15.7, "NVIDIA T4 16 GB, 8.1 TFLOP/s FP32"),
    Kind("A100", 80 * _GiB, 19.5 / 15.7, "NVIDIA A100 80 GB, 19.5 TFLOP/s FP32", (), 312e12, 2039e9,
         *A100_GEMM),
    Kind("H100", 80 * _GiB, 67.0 / 15.7, "NVIDIA H100 SXM 80 GB, 67 TFLOP/s FP32", (), 989e12, 3350e9,
         fp8_flops=1979e12),
    Kind("A100-40GB", 40 * _GiB, 19.5 / 15.7, "NVIDIA A100 SXM 40 GB: 312 TFLOP/s bf16, 1,555 GB/s HBM2",
         (), 312e12, 1555e9, *A100_GEMM, A100_RATES),
    Kind("A100-80GB", 80 * _GiB, 19.5 / 15.7, "NVIDIA A100 SXM 80 GB: 312 TFLOP/s bf16, 2,039 GB/s HBM2e",
         (), 312e12, 2039e9, *A100_GEMM, A100_RATES),
    Kind("H100-SXM", 80 * _GiB, 67.0 / 15.7, "NVIDIA H100 SXM 80 GB: 989 TFLOP/s bf16, 3,350 GB/s HBM3",
         (), 989e12, 3350e9, *H100_GEMM, "GEMMs timed alone on a lent H100, no whole layer", 1979e12),
    Kind("H800", 80 * _GiB, 67.0 / 15.7, "NVIDIA H800 SXM 80 GB: the H100's silicon (989 TFLOP/s bf16, 3,350 GB/s "
         "HBM3), NVLink 400 GB/s", (), 989e12, 3350e9, *H100_GEMM,
         "the H100's GEMMs (the same silicon) timed alone on a lent H100, no whole layer", 1979e12),
    Kind("GPU", 32 * _GiB, 1.0, "a generic device equal to the reference"),
    Kind("CPU", 8 * _GiB, 1.0, "a CPU worker process (speed relative to the profile's process; "
         "measure it with pipeplan calibrate)"),
    Kind("laptop-i7-gtx1650", 32 * _GiB, (0.50 + 3.2) / 15.7, "laptop: Intel i7-10750H + GTX 1650, 32 GB",
         (_cpu("cpu", 0.50), _gpu("gpu", 3.2))),
    Kind("laptop-i5-irisxe", 16 * _GiB, (0.31 + 1.66) / 15.7, "laptop: Intel i5-1135G7 + Iris Xe, 16 GB",
         (_cpu("cpu", 0.31), _gpu("gpu", 1.66))),
    Kind("rpi4b", 4 * _GiB, 0.048 / 15.7, "Raspberry Pi 4B: Cortex-A72 x 4, 4 GB",
         (_cpu("cpu", 0.048),)),
)}


def kind(name: str) -> Kind:
    k = KINDS.get(name.lower())
    if k is None:
        raise PipeplanError(f"unknown device kind {name!r} (known: {', '.join(x.name for x in KINDS.values())})")
    return k
