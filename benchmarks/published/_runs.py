"""Published large-scale training runs (``megatron_sc21.yaml``) as pipeplan inputs: each row's
model, cluster and 3D configuration, its predicted throughput, and joint's plan for the same
model, GPUs and global batch. Shared by ``megatron_sc21.py`` (the benchmark), ``calibrate.py``
(the fit of the global constants) and the tests, which re-run a few rows."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeplan.cluster import Cluster, load_cluster
from pipeplan.graph import Graph, load_graph
from pipeplan.llm.layout import even
from pipeplan.llm.parallelism import Parallelism
from pipeplan.planners import llm3d
from pipeplan.planners.llm3d import Pins
from pipeplan.sim import SimResult, simulate

DATA = Path(__file__).resolve().parent / "megatron_sc21.yaml"


@dataclass(frozen=True)
class Row:
    """One published run: its model, GPUs, configuration and measured TFLOP/s per GPU."""

    params_b: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    global_batch: int
    microbatch: int
    virtual_stages: int
    tflops_per_gpu: float

    @property
    def name(self) -> str:
        return f"{self.params_b:g}B"

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)


def load_rows(path: Path = DATA) -> tuple[dict, list[Row]]:
    """The file's header (source, GPU, sequence, vocabulary, recomputation) and its rows."""
    data = yaml.safe_load(path.read_text())
    return {k: v for k, v in data.items() if k != "rows"}, [Row(**r) for r in data["rows"]]


def model_of(head: dict, row: Row) -> Graph:
    return load_graph(f"zoo:gpt?hidden={row.hidden}&layers={row.layers}&heads={row.heads}"
                      f"&seq={head['seq']}&vocab={head['vocab']}")


def cluster_of(head: dict, row: Row) -> Cluster:
    return load_cluster(f"dgx-a100x{math.ceil(row.gpus / head['servers_of'])}")


def published_config(head: dict, row: Row) -> Parallelism:
    """The row's configuration as Megatron-LM ran it: equal layers per chunk, no sequence
    parallelism, no distributed optimizer, no overlap of the gradient all-reduce (all came
    later), blocking pipeline sends (the interleaved schedule's overlap came later too), 16-bit
    gradients reduced (fp16 training: Megatron kept ``accumulate_allreduce_grads_in_fp32`` off),
    the header's recomputation."""
    schedule = "interleaved-1f1b" if row.virtual_stages > 1 else "1f1b"
    return Parallelism(row.tp, row.pp, row.dp, even(row.layers, row.pp, row.virtual_stages), row.virtual_stages,
                       microbatch=row.microbatch, recompute=head["recompute"], grad_reduce="bf16",
                       overlap_p2p=False, schedule=schedule)


def predict(head: dict, row: Row) -> SimResult:
    """The published configuration simulated."""
    plan = llm3d.plan_of(model_of(head, row), cluster_of(head, row), published_config(head, row), row.global_batch)
    return simulate(plan, timeline=False)


def joint(head: dict, row: Row, simulations: int) -> tuple[Parallelism, SimResult, dict]:
    """joint's 3D search on the row's model, GPUs and global batch, not told the published
    configuration (Megatron-LM's rule of thumb is among what it simulates, as ever)."""
    graph, cluster = model_of(head, row), cluster_of(head, row)
    spec = llm3d.spec_of(graph)
    base = (llm3d.rule_of_thumb(spec, cluster, row.global_batch, Pins(), "adam"),)
    plan = llm3d.search(graph, cluster, row.global_batch, Pins(), "adam", simulations, False, base)
    return plan.parallelism, simulate(plan, timeline=False), plan.extra["llm3d"]


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def pairs_in_order(published: list[float], predicted: list[float], apart: float) -> tuple[int, int]:
    """(pairs ordered as published, pairs) among rows whose published figures differ by more
    than ``apart`` (a fraction of the smaller)."""
    good = total = 0
    for i in range(len(published)):
        for j in range(i + 1, len(published)):
            lo, hi = sorted((published[i], published[j]))
            if hi > lo * (1 + apart):
                total += 1
                good += (published[i] - published[j]) * (predicted[i] - predicted[j]) > 0
    return good, total
