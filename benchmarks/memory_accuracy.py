"""Memory model against real peak memory: pipeplan's predicted bytes per device versus the
CPU allocator's peak during real training steps on this machine.

Per model: ``profile_model`` gives the graph (``act``, ``saved``, ``inplace`` per node); a
plan of the same setup (Adam, M microbatches, the gpipe schedule: all M forwards then all M
backwards) on one stage, and on two stages cut in the middle of the chain, gives
``simulate(plan, timeline=False).memory_bytes``. The same steps run for real in this process,
each stage by itself (the model built, the other stage's layers dropped): two steps, the
first creating Adam's state, the second measured. Stage 0 keeps each microbatch's output
until its backward (as torch.distributed.pipelining does); stage 1 receives a fresh tensor
per microbatch; the last stage's loss is the runtime's (squared error against a target).

Measurement: ``torch.profiler`` with ``profile_memory=True`` reports every allocation and
free of the CPU allocator with its running total of live bytes; the model is built inside
the profiled window, so the total is absolute. The peak is its maximum over the second step.
The terms (docs/memory.md): parameters, gradients, Adam state, data (inputs and targets of
the M microbatches), activations saved per microbatch (growth over the M forwards / M), and
the rest of the peak (transient workspace). Writes benchmarks/results/memory_accuracy.json.

    python benchmarks/memory_accuracy.py [--microbatches M] [--out DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _results.py and this module's factories
from _results import add_out_argument, write_json  # noqa: E402

from pipeplan.cluster.build import hierarchical  # noqa: E402
from pipeplan.plan import Plan, Stage  # noqa: E402
from pipeplan.runtime.models import load_model  # noqa: E402
from pipeplan.runtime.profiler import profile_model  # noqa: E402
from pipeplan.sim import simulate  # noqa: E402

TARGET = 0.15
MODELS = ["example:mlp", "example:transformer", "example:cnn", "memory_accuracy:inplace_cnn",
          "memory_accuracy:hf_bert"]


def inplace_cnn(microbatch: int = 16) -> tuple[nn.Module, torch.Tensor]:
    """A VGG-style CNN as torchvision writes them: conv + BatchNorm + ReLU(inplace=True),
    max-pooling, a classifier with in-place ReLU and Dropout."""
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    model = nn.Sequential(*block(3, 32), *block(32, 32), nn.MaxPool2d(2), *block(32, 64), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(inplace=True), nn.Dropout(0.5),
                          nn.Linear(256, 10))
    return model, torch.randn(microbatch, 3, 32, 32)


class _HFLayer(nn.Module):
    """A Hugging Face encoder layer that takes and returns one tensor."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        return out[0] if isinstance(out, tuple) else out


def hf_bert(microbatch: int = 8) -> tuple[nn.Module, torch.Tensor]:
    """A 4-layer BERT (d=128, 4 heads) from a config, random weights, as nn.Sequential."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=512, max_position_embeddings=128)
    bert = BertModel(cfg, add_pooling_layer=False)
    layers = [_HFLayer(bert.embeddings), *(_HFLayer(layer) for layer in bert.encoder.layer)]
    return nn.Sequential(*layers), torch.randint(0, cfg.vocab_size, (microbatch, 64))


@dataclass
class Measured:
    """Bytes of one stage's second training step (see the module docstring)."""

    params: float
    grads: float
    adam: float
    data: float
    saved_per_microbatch: float
    peak: float
    microbatches: int

    @property
    def transient(self) -> float:
        """What the peak holds beyond state, data and M microbatches' saved activations."""
        return self.peak - (self.params + self.grads + self.adam + self.data
                            + self.microbatches * self.saved_per_microbatch)


def _allocations(prof: profile) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[int, int]]]:
    """Times and running totals of the allocator's events; the [start, end] of each marker."""
    from torch._C._profiler import _EventType

    allocs, marks, stack = [], {}, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            f = node.extra_fields
            allocs.append((node.start_time_ns, f.total_allocated, f.alloc_size))
        elif node.name.startswith("mark:"):
            marks[node.name[5:]] = (node.start_time_ns, node.end_time_ns)
        stack.extend(node.children)
    allocs.sort()
    base = allocs[0][1] - allocs[0][2]  # the allocator's count before the window
    return np.array([a[0] for a in allocs]), np.array([a[1] - base for a in allocs], float), marks


def _level(times: np.ndarray, totals: np.ndarray, t: int) -> float:
    k = int(np.searchsorted(times, t, side="right"))
    return float(totals[k - 1]) if k else 0.0


def _stage_model(spec: str, lo: int, hi: int) -> nn.Sequential:
    """Layers [lo, hi) of the model; the others are freed."""
    model, _ = load_model(spec, seed=0)
    kept = list(model.children())[lo:hi]
    del model
    return nn.Sequential(*kept).train()


def _stage_inputs(spec: str, lo: int, m: int) -> list[torch.Tensor]:
    """M microbatch inputs of a stage starting at layer ``lo``: data, or received tensors."""
    model, x = load_model(spec, seed=0)
    if lo:
        with torch.no_grad():
            x = nn.Sequential(*list(model.children())[:lo])(x)
        return [x.clone().requires_grad_(True) for _ in range(m)]
    return [x.clone() for _ in range(m)]


def _train_step(stage: nn.Module, opt: torch.optim.Optimizer, xs: list[torch.Tensor],
                ys: list[torch.Tensor] | None, tag: str) -> None:
    """All forwards, then all backwards (gpipe), then the update; ``ys`` None: not the last
    stage, whose outputs stay until their backward, fed a gradient as if received."""
    opt.zero_grad(set_to_none=True)
    with record_function(f"mark:{tag}forward"):
        outs = [stage(x) for x in xs]
        losses = None if ys is None else [((o - y) ** 2).sum() / y.numel() for o, y in zip(outs, ys)]
    if losses is not None:
        del outs
    with record_function(f"mark:{tag}backward"):
        for k in reversed(range(len(xs))):
            if losses is not None:
                losses.pop().backward()
            else:
                out = outs.pop()
                out.backward(torch.ones_like(out))
                del out
            xs[k].grad = None  # a received input's gradient is sent back, not kept
    opt.step()


def measure(spec: str, lo: int, hi: int, last: bool, m: int) -> Measured:
    """Peak and its terms for layers [lo, hi) of ``spec`` with ``m`` microbatches, measured in
    a fresh process (the allocator's count must start with nothing of an earlier run alive)."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_measure, (spec, lo, hi, last, m))


def _measure(spec: str, lo: int, hi: int, last: bool, m: int) -> Measured:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        stage = _stage_model(spec, lo, hi)
        xs = _stage_inputs(spec, lo, m)
        ys = None
        if last:
            with torch.no_grad():
                out_shape = stage(xs[0]).shape
            ys = [torch.randn(out_shape) for _ in range(m)]
        opt = torch.optim.Adam(stage.parameters(), lr=1e-4)
        _train_step(stage, opt, xs, ys, "1")
        with record_function("mark:2step"):
            _train_step(stage, opt, xs, ys, "2")
    times, totals, marks = _allocations(prof)
    fs, fe = marks["2forward"]
    s0, s1 = marks["2step"]
    inside = (times >= s0) & (times <= s1)
    params = float(sum(p.numel() * p.element_size() for p in stage.parameters()))
    grads = float(sum(p.grad.numel() * p.grad.element_size() for p in stage.parameters()
                      if p.grad is not None))
    adam = float(sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values()))
    data = float(sum(x.numel() * x.element_size() for x in xs + (ys or [])))
    saved = (_level(times, totals, fe) - _level(times, totals, fs)) / m
    return Measured(params, grads, adam, data, saved, float(totals[inside].max()), m)


def middle_cut(graph) -> int:
    """The middle of the chain (deterministic, unlike a cut by measured time), moved past
    aliasing layers (an in-place layer may not modify the tensor a stage receives)."""
    cut = len(graph) // 2
    while cut < len(graph) - 1 and graph.inplace[cut]:
        cut += 1
    return cut


def gradient_working_set(graph, lo: int, hi: int) -> float:
    """Largest gradient pair of a backward step in layers [lo, hi): the gradient w.r.t. a
    layer's output and the one w.r.t. its input (none for the first layer of the model)."""
    return max(float(graph.act[i] + (graph.act[i - 1] if i > 0 else 0.0)) for i in range(lo, hi))


def predict(graph, cuts: list[int], m: int) -> list[float]:
    """pipeplan's memory per stage for the gpipe plan with stages split at ``cuts``."""
    cluster = hierarchical("cpu", 1, len(cuts) + 1, intra=1e9, inter=1e9, memory=1e15)
    bounds = [0, *cuts, len(graph)]
    stages = [Stage(graph.ids[a:b], [cluster.names[k]]) for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    plan = Plan(graph, cluster, stages, m, schedule="gpipe", optimizer="adam")
    return [float(v) for v in simulate(plan, timeline=False).memory_bytes]


def run_model(spec: str, m: int) -> dict:
    graph = profile_model(spec, warmup=0, reps=1)
    outputs_only = dataclasses.replace(graph, inplace=None, saved=None)  # every output kept, nothing else
    cut = middle_cut(graph)
    n = len(graph)
    out = {"model": spec, "nodes": len(graph), "microbatches": m, "cut": cut,
           "graph": {"act_bytes": float(graph.act.sum()), "saved_bytes": float(graph.saved.sum()),
                     "inplace_nodes": [graph.ids[i] for i in np.flatnonzero(graph.inplace)],
                     "params_bytes": float(graph.params.sum())}, "plans": []}
    for label, ranges in (("1 stage", [(0, n)]), ("2 stages", [(0, cut), (cut, n)])):
        cuts = [cut] if len(ranges) == 2 else []
        predicted, by_outputs = predict(graph, cuts, m), predict(outputs_only, cuts, m)
        for s, ((lo, hi), pred, pred_act) in enumerate(zip(ranges, predicted, by_outputs)):
            meas = measure(spec, lo, hi, hi == n, m)
            row = {"plan": label, "stage": s, "layers": [lo, hi], "predicted_bytes": pred,
                   "measured_peak_bytes": meas.peak, "error": (pred - meas.peak) / meas.peak,
                   "predicted_from_outputs_bytes": pred_act,
                   "error_from_outputs": (pred_act - meas.peak) / meas.peak,
                   "graph_saved_per_microbatch": float(graph.saved[lo:hi].sum()),
                   "graph_act_per_microbatch": float(graph.act[lo:hi].sum()),
                   "received_per_microbatch": float(graph.act[lo - 1]) if lo else 0.0,
                   "gradient_working_set": gradient_working_set(graph, lo, hi),
                   "measured": {**asdict(meas), "transient": meas.transient}}
            out["plans"].append(row)
    return out


def _row(r: dict, spec: str) -> str:
    mb = 1 / 2**20
    meas = r["measured"]
    return (f"{spec:<28} {r['plan']:<8} s{r['stage']} {r['measured_peak_bytes'] * mb:9.2f} "
            f"{r['predicted_bytes'] * mb:9.2f} {r['error']:+7.1%} {r['error_from_outputs']:+7.1%}  "
            f"saved/mb {meas['saved_per_microbatch'] * mb:7.2f} "
            f"(graph {r['graph_saved_per_microbatch'] * mb:7.2f}, act {r['graph_act_per_microbatch'] * mb:7.2f}) "
            f"data {meas['data'] * mb:6.2f} transient {meas['transient'] * mb:6.2f} "
            f"(gradient pair {r['gradient_working_set'] * mb:5.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--microbatches", type=int, default=4)
    add_out_argument(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    results, skipped = [], {}
    print(f"{'model':<28} {'plan':<8} st {'peak MiB':>9} {'pred MiB':>9} {'error':>7} {'outputs':>7}  "
          "(outputs: the error if every layer's output were kept, nothing else)")
    for spec in MODELS:
        if spec.endswith("hf_bert"):
            try:
                import transformers  # noqa: F401
            except ImportError:
                skipped[spec] = "transformers is not installed"
                print(f"{spec:<28} skipped: transformers is not installed")
                continue
        res = run_model(spec, args.microbatches)
        results.append(res)
        for r in res["plans"]:
            print(_row(r, spec))
    worst = {r["model"]: max(abs(p["error"]) for p in r["plans"]) for r in results}
    ok = all(e <= TARGET for e in worst.values())
    print(f"largest |error| per model, every stage of every plan: "
          f"{', '.join(f'{k} {v:.1%}' for k, v in worst.items())} (target {TARGET:.0%}: {'met' if ok else 'NOT met'})")
    write_json(args.out / "memory_accuracy.json", {"target": TARGET, "target_met": ok, "models": results,
                                                   "worst_error": worst, "skipped": skipped})


if __name__ == "__main__":
    main()
