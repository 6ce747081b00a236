"""Measured time of a whole decoder layer on this GPU, as one tensor-parallel rank runs it:
what the cost model's layer times (``llm/costs.py`` ``layer_compute_s``) are checked against.

GPT-3-style layers (LayerNorm with bias, GELU MLP of 4h, biases, dropout 0.1; the learned
positions are outside the layer) at sequence 2048 and Llama 3 layers (RMSNorm, SwiGLU, rotary
positions, grouped-query attention, no biases) at 8192, microbatches of 1 and 2, each on one
rank of a tensor-parallel group of t: heads, key/value heads and MLP columns divided by t,
no communication. bf16, eager PyTorch (no fused bias-GELU or bias-dropout-add), attention by
``scaled_dot_product_attention`` (causal: its kernel skips the masked half, which the FLOP
count, as Megatron's, does not). Per shape, the median seconds (CUDA events, after a warm-up)
of: the forward keeping its activations; the backward of such a forward; the forward under
``no_grad`` (what full recomputation runs again); the attention core's forward, and its
forward + backward (selective recomputation); and a fused AdamW ``step()`` over fp32 master
weights of the rank's parameters. Shapes whose layer or optimizer would not fit in the GPU's
free memory are skipped. Needs a CUDA device (without one it says so and exits 2):

    python benchmarks/gpu/layer_timing.py [--quick]
    python benchmarks/gpu/layer_timing.py --device cpu --tiny [--out DIR]   # smoke test, fp32

Writes benchmarks/results/gpu/layer_timing_<gpu>.json (rows: the model's dimensions, tp,
the seconds above, the rank's parameters and FLOPs, TFLOP/s); ``--tiny`` writes to --out or a
new temporary folder, never under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _results import RESULTS, add_out_argument, write_json  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))  # pipeplan without installing it
from pipeplan.llm.spec import PRESETS, DecoderSpec, gpt, llama  # noqa: E402

#: GPT-3-style layers: (hidden, heads); tensor-parallel degrees; Llama 3 presets and theirs
GPT = ((6144, 48), (12288, 96), (20480, 128))
GPT_TP = (8, 1)
LLAMA = ("llama3-8b", "llama3-70b", "llama3-405b")
LLAMA_TP = (8, 4, 1)
MICROBATCH = (1, 2)
ROPE_BASE = 500000.0  # Llama 3's rotary base


@dataclass(frozen=True)
class Shape:
    spec: DecoderSpec
    microbatch: int
    tp: int
    dropout: float


def shapes(quick: bool, tiny: bool, dropout: float) -> list[Shape]:
    """The shapes to time, model by model, tp by tp, microbatch by microbatch."""
    if tiny:  # big enough for the GEMMs, not the per-op overhead, to dominate on a CPU
        models = [(gpt("gpt-tiny", 256, 1, 4, seq=64), dropout, (1, 2)),
                  (llama("llama-tiny", 256, 1, 4, 2, 704, seq=64), 0.0, (1, 2))]
        return [Shape(spec, 2, tp, p) for spec, p, tps in models for tp in tps]
    models = [(gpt(f"gpt-h{h}", h, 1, a), dropout, GPT_TP) for h, a in GPT]
    models += [(PRESETS[name], 0.0, LLAMA_TP) for name in LLAMA]
    if quick:
        models = [(spec, p, (8,)) for spec, p, _ in (models[0], models[1], models[3], models[4])]
    return [Shape(spec, b, tp, p) for spec, p, tps in models for tp in tps for b in MICROBATCH]


def rope_table(seq: int, dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """cos and sin of each position's rotary angles, (2, seq, dim), halves rotated together."""
    inv = ROPE_BASE ** -(torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv).repeat(1, 2)
    return torch.stack([angles.cos(), angles.sin()]).to(dtype)


def rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotary positions applied to queries or keys (batch, heads, seq, head_dim)."""
    a, b = x.chunk(2, dim=-1)
    return x * table[0] + torch.cat([-b, a], dim=-1) * table[1]


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
    """Causal fused attention, grouped-query when there are fewer key/value heads."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                          enable_gqa=q.shape[1] != k.shape[1])


class DecoderLayer(nn.Module):
    """One tensor-parallel rank's share of a decoder layer (Megatron's split): its heads,
    key/value heads and MLP columns; the norms and the biases added after the row-parallel
    matrices (attention output, MLP's last) whole."""

    def __init__(self, spec: DecoderSpec, tp: int, dropout: float, device: torch.device, dtype: torch.dtype):
        super().__init__()
        dev, h, bias = {"device": device, "dtype": dtype}, spec.hidden, spec.bias
        self.heads, self.kv, self.gated, self.p = spec.heads // tp, spec.kv_heads // tp, spec.gated, dropout
        self.head_dim, ffn = spec.head_dim, spec.ffn // tp
        if spec.norm == "layernorm":
            self.norm1, self.norm2 = (nn.LayerNorm(h, bias=bias, **dev) for _ in range(2))
        else:
            self.norm1, self.norm2 = (nn.RMSNorm(h, **dev) for _ in range(2))
        self.qkv = nn.Linear(h, (self.heads + 2 * self.kv) * self.head_dim, bias=bias, **dev)
        self.proj = nn.Linear(self.heads * self.head_dim, h, bias=bias, **dev)
        self.fc1 = nn.Linear(h, (2 if spec.gated else 1) * ffn, bias=bias, **dev)
        self.fc2 = nn.Linear(ffn, h, bias=bias, **dev)
        self.rope = rope_table(spec.seq, self.head_dim, device, dtype) if spec.positions == "rope" else None

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.heads + 2 * self.kv, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split([self.heads, self.kv, self.kv], dim=1)
        if self.rope is not None:
            q, k = rotate(q, self.rope), rotate(k, self.rope)
        return self.proj(attention_core(q, k, v, self.p).transpose(1, 2).reshape(b, s, -1))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        if self.gated:
            gate, up = y.chunk(2, dim=-1)
            return self.fc2(F.silu(gate) * up)
        return self.fc2(F.gelu(y, approximate="tanh"))

    def drop(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.p) if self.p else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attention(self.norm1(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


@dataclass(frozen=True)
class Clock:
    """Median seconds of a call: CUDA events on a GPU, the wall clock on a CPU."""

    cuda: bool
    repeat: int
    warmup: int

    def once(self, run: Callable[[], Any]) -> float:
        if not self.cuda:
            start = time.perf_counter()
            run()
            return time.perf_counter() - start
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def median_s(self, run: Callable[[Any], Any], setup: Callable[[], Any] = lambda: None) -> float:
        """``run(setup())``, timing ``run`` alone (``setup`` prepares its argument untimed)."""
        times = []
        for i in range(self.warmup + self.repeat):
            arg = setup()
            seconds = self.once(lambda: run(arg))
            if i >= self.warmup:
                times.append(seconds)
        return statistics.median(times)


def time_layer(layer: DecoderLayer, x: torch.Tensor, clock: Clock) -> dict[str, float]:
    """Forward, backward (of a forward that kept its activations) and the no_grad forward."""
    grad = torch.randn_like(x)

    def recompute(_: None) -> None:
        with torch.no_grad():
            layer(x)

    return {"fwd_s": clock.median_s(lambda _: layer(x)),
            "bwd_s": clock.median_s(lambda y: y.backward(grad), setup=lambda: layer(x)),
            "recompute_fwd_s": clock.median_s(recompute)}


def time_core(layer: DecoderLayer, x: torch.Tensor, clock: Clock) -> dict[str, float]:
    """The attention core alone on the rank's queries, keys and values: forward, forward + backward."""
    b, s, _ = x.shape
    q, k, v = (torch.randn(b, n, s, layer.head_dim, device=x.device, dtype=x.dtype, requires_grad=True)
               for n in (layer.heads, layer.kv, layer.kv))
    grad = torch.randn_like(q)
    return {"attn_core_fwd_s": clock.median_s(lambda _: attention_core(q, k, v, layer.p)),
            "attn_core_s": clock.median_s(lambda _: attention_core(q, k, v, layer.p).backward(grad))}


def time_optimizer(sizes: list[torch.Size], clock: Clock, device: torch.device) -> float:
    """One fused AdamW ``step()`` over fp32 master weights (and gradients) of these shapes."""
    master = [nn.Parameter(torch.randn(size, device=device)) for size in sizes]
    for p in master:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW(master, lr=1e-4, fused=True)
    return clock.median_s(lambda _: optimizer.step())


def measure(shape: Shape, clock: Clock, device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """Every time of one shape, and the rank's parameter count."""
    spec = shape.spec
    layer = DecoderLayer(spec, shape.tp, shape.dropout, device, dtype)
    x = torch.randn(shape.microbatch, spec.seq, spec.hidden, device=device, dtype=dtype, requires_grad=True)
    times = {**time_layer(layer, x, clock), **time_core(layer, x, clock)}
    sizes = [p.shape for p in layer.parameters()]
    del layer, x  # the bf16 layer makes room for the optimizer's fp32 state
    if clock.cuda:
        torch.cuda.empty_cache()
    return {**times, "optimizer_step_s": time_optimizer(sizes, clock, device), "params": sum(s.numel() for s in sizes)}


def fits(shape: Shape, cuda: bool) -> bool:
    """Whether the layer (16-bit weights, gradients, twice the activations Korthikanti et al.
    count) and, after it, the optimizer (fp32 weights, gradients, two moments) fit in free memory."""
    if not cuda:
        return True
    params = shape.spec.layer_params() / shape.tp
    layer = 4 * params + 2 * shape.spec.layer_activation_bytes(shape.microbatch, shape.tp)
    return max(layer, 16 * params) < 0.9 * torch.cuda.mem_get_info()[0]


def row(shape: Shape, t: dict[str, float]) -> dict[str, Any]:
    """One results row: the model's dimensions (the rank runs heads, kv_heads and ffn / tp),
    the times, the rank's parameters and forward FLOPs (llm/spec.py's count / tp), TFLOP/s."""
    spec, b, tp = shape.spec, shape.microbatch, shape.tp
    fwd, core = spec.layer_flops(b) / tp, 3 * spec.attention_core_flops(b) / tp
    return {"model": spec.name, "hidden": spec.hidden, "heads": spec.heads, "kv_heads": spec.kv_heads,
            "ffn": spec.ffn, "seq": spec.seq, "microbatch": b, "tp": tp, "gated": spec.gated, "norm": spec.norm,
            "dropout": shape.dropout, "fwd_s": t["fwd_s"], "bwd_s": t["bwd_s"],
            "recompute_fwd_s": t["recompute_fwd_s"], "attn_core_fwd_s": t["attn_core_fwd_s"],
            "attn_core_s": t["attn_core_s"], "optimizer_step_s": t["optimizer_step_s"], "params": t["params"],
            "fwd_flops": fwd, "fwd_tflops": fwd / t["fwd_s"] / 1e12, "bwd_tflops": 2 * fwd / t["bwd_s"] / 1e12,
            "recompute_tflops": fwd / t["recompute_fwd_s"] / 1e12, "attn_core_flops": core,
            "attn_core_tflops": core / t["attn_core_s"] / 1e12}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few shapes, fewer repeats (a smoke run)")
    parser.add_argument("--if-gpu", action="store_true", help="without a CUDA GPU, say so and exit 0 (make bench)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke test); never written to results/")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: fp32, --tiny only")
    parser.add_argument("--dropout", type=float, default=0.1, help="GPT layers' dropout (Llama's: none)")
    add_out_argument(parser, "gpu")
    parser.set_defaults(out=None)  # resolved in main: results/gpu, or with --tiny a temporary folder
    args = parser.parse_args()
    if args.device == "cpu" and not args.tiny:
        parser.error("--device cpu times --tiny shapes only")
    if args.tiny and args.out is not None and args.out.is_relative_to(RESULTS):
        parser.error("--tiny writes no results: give an --out outside benchmarks/results")
    return args


def main() -> None:
    args = parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        if args.if_gpu:  # make bench on a machine without one: the last GPU run stays
            print("layer_timing: no CUDA device here; skipped (benchmarks/results/gpu keeps the last GPU run)")
            return
        print("layer_timing: needs a CUDA GPU and none is here (--device cpu --tiny: a CPU smoke test); "
              "nothing written", file=sys.stderr)
        sys.exit(2)
    out = args.out or (Path(tempfile.mkdtemp(prefix="layer_timing_")) if args.tiny else RESULTS / "gpu")
    device, dtype = torch.device(args.device), torch.bfloat16 if cuda else torch.float32
    clock = Clock(cuda, repeat=5 if args.quick else 10, warmup=2 if args.tiny else 3)
    torch.manual_seed(0)
    rows = []
    for shape in shapes(args.quick, args.tiny, args.dropout):
        what = f"{shape.spec.name:12s} tp={shape.tp} b={shape.microbatch}"
        if not fits(shape, cuda):
            print(f"{what}: skipped (does not fit in memory)")
            continue
        try:
            rows.append(row(shape, measure(shape, clock, device, dtype)))
        except torch.OutOfMemoryError:
            print(f"{what}: skipped (out of memory)")
            continue
        finally:
            if cuda:
                torch.cuda.empty_cache()
        r = rows[-1]
        print(f"{what}: fwd {r['fwd_s'] * 1e3:8.3f} ms ({r['fwd_tflops']:6.1f} TFLOP/s)  bwd {r['bwd_s'] * 1e3:8.3f} ms"
              f"  recompute {r['recompute_fwd_s'] * 1e3:8.3f} ms  core {r['attn_core_s'] * 1e3:7.3f} ms"
              f"  adamw {r['optimizer_step_s'] * 1e3:7.3f} ms")
    name = torch.cuda.get_device_name() if cuda else "cpu"
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    path = write_json(out / f"layer_timing_{slug}.json", {
        "gpu": name, "torch": torch.__version__, "cuda": torch.version.cuda, "device": args.device,
        "dtype": str(dtype).removeprefix("torch."), "repeat": clock.repeat, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
