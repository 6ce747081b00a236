"""Achieved bf16 throughput of a transformer layer's matrix multiplications on this GPU, by
shape: what the cost model's GEMM efficiency curve (``cluster/gemm.py``) is checked against.

For hidden sizes h, tokens per microbatch T (= samples x sequence) and tensor-parallel
degrees t, the four GEMMs of a GPT layer's forward as one tensor-parallel rank runs them
(Megatron's split: QKV and fc1 by output columns, the attention projection and fc2 by input
rows), each timed with CUDA events over repeated calls after a warm-up; plus the HBM
bandwidth of a large device-to-device copy. Needs a CUDA device (``device`` lends one;
without one it says so and writes nothing):

    python benchmarks/gpu/gemm_efficiency.py [--quick]

Writes benchmarks/results/gpu/gemm_<gpu>.json (every shape: m, n, k, seconds, TFLOP/s).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import add_out_argument, write_json  # noqa: E402

HIDDEN = (1024, 2048, 4096, 6144, 8192, 12288, 16384, 25600)
TOKENS = (2048, 4096, 8192, 16384)
TP = (1, 2, 4, 8)


def layer_gemms(h: int, tokens: int, tp: int) -> dict[str, tuple[int, int, int]]:
    """(m, n, k) of each forward GEMM of one rank: out[m, n] = in[m, k] @ w[k, n]."""
    return {"qkv": (tokens, 3 * h // tp, h), "proj": (tokens, h, h // tp),
            "fc1": (tokens, 4 * h // tp, h), "fc2": (tokens, h, 4 * h // tp)}


def time_gemm(m: int, n: int, k: int, repeat: int) -> float:
    """Median seconds of one bf16 ``a @ b`` of this shape."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def hbm_bandwidth(gib: float = 4.0, repeat: int = 10) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    n = int(gib * 2**30) // 2
    x = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        y.copy_(x)
    end.record()
    end.synchronize()
    return 2 * x.numel() * 2 * repeat / (start.elapsed_time(end) / 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repeats (a smoke run)")
    add_out_argument(parser, "gpu")
    args = parser.parse_args()
    if not torch.cuda.is_available():  # make bench on a machine without one: the last GPU run stays
        print("gemm_efficiency: no CUDA device here; skipped (benchmarks/results/gpu keeps the last GPU run)")
        return
    name = torch.cuda.get_device_name()
    hidden, tokens, repeat = (HIDDEN[:3], TOKENS[:2], 5) if args.quick else (HIDDEN, TOKENS, 20)
    rows = []
    for h in hidden:
        for t_count in tokens:
            for tp in TP:
                for gemm, (m, n, k) in layer_gemms(h, t_count, tp).items():
                    s = time_gemm(m, n, k, repeat)
                    rows.append({"hidden": h, "tokens": t_count, "tp": tp, "gemm": gemm, "m": m, "n": n, "k": k,
                                 "seconds": s, "tflops": 2 * m * n * k / s / 1e12})
                    print(f"h={h:6d} T={t_count:6d} tp={tp} {gemm:4s} {rows[-1]['tflops']:7.1f} TFLOP/s")
    bw = hbm_bandwidth()
    print(f"HBM copy: {bw / 1e12:.2f} TB/s")
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    write_json(args.out / f"gemm_{slug}.json", {"gpu": name, "torch": torch.__version__,
                                                "cuda": torch.version.cuda, "hbm_copy_bytes_per_s": bw,
                                                "gemms": rows})


if __name__ == "__main__":
    main()
