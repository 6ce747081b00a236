"""The validation set (``validation.yaml``: published runs never fitted on) as pipeplan inputs:
each usable row's model, cluster and configuration as it ran, pinned, its prediction and its
error. Shared by ``validation.py`` (the benchmark) and the tests.

A row is used when its configuration is stated (TP, PP, DP, microbatch, global batch,
recomputation) or the fields it leaves out follow from its source's text; each such reading
is in ``READINGS`` with its reason, and every row left out says why (``excluded``). FP8 rows,
rows with context parallelism and mixtures of experts are compared apart
(``validation_5d.py``), and so a model that is not a GPT/Llama-style decoder is left out."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipeplan.cluster import Cluster, load_cluster
from pipeplan.graph import Graph
from pipeplan.graph.llm import build_graph
from pipeplan.llm.spec import gpt, llama
from pipeplan.llm.layout import candidates, chunked
from pipeplan.llm.parallelism import Parallelism
from pipeplan.planners import llm3d
from pipeplan.sim import SimResult, simulate

DATA = Path(__file__).resolve().parent / "validation.yaml"

#: Fields a row leaves out, read from its source (the reason says where); every other field as
#: the row states it.
READINGS: dict[str, tuple[dict, str]] = {
    **{f"sc21_t2_ptdp_{m}": ({"virtual_stages": 1}, "Table 2 states no interleaving; 1F1B assumed")
       for m in ("175b_384", "175b_768", "175b_1536", "530b_560", "530b_1120", "530b_2240")},
    **{f"korthikanti_t5_1t_{k}": ({"virtual_stages": 1}, "§6 names interleaving for 175B and 530B only")
       for k in ("full", "present")},
    **{f"llama3_t4_405b_{n}": ({"virtual_stages": 8, "microbatch": 1, "sequence_parallel": True,
                                "stage_layers": [7] + [8] * 14 + [7]},
                               "§3.3.2: one layer fewer on the first and last stage and 'the first model chunk on "
                               "the first stage has only the embedding': chunks of one layer, V = 8; microbatch 1 "
                               "(16-32 sequences a DP group over 16 stages); TP with sequence parallelism (TP "
                               "cites Korthikanti et al.); FSDP's sharded optimizer state as ZeRO-1")
       for n in ("8192", "16384")},
    **{f"mtnlg_530b_{n}": ({"microbatch": 1, "recompute": "full", "virtual_stages": 1, "vocab": 51200},
                           "MT-NLG: activation checkpointing, DeepSpeed's 1F1B pipeline (no interleaving), "
                           "microbatch 1; vocabulary 51,200 (their TFLOP/s follow from Eq. 3 with it)")
       for n in ("2240", "2800", "3360")},
    "bloom_176b_384": ({"stage_layers": [5] + [6] * 10 + [5]},
                       "the BLOOM training README: 5 layers + embedding on the first and last stage, 6 between"),
}


@dataclass(frozen=True)
class Run:
    """One validation row as pinned: its id, source, model, cluster, configuration, global
    batch, the published figure compared and its kind."""

    id: str
    source: str
    graph: Graph
    cluster: Cluster
    par: Parallelism
    global_batch: int
    metric: str  # iteration_s | hw_tflops_per_gpu | model_tflops_per_gpu | mfu
    published: float
    reading: str | None


def _why_excluded(row: dict) -> str | None:
    if row.get("arch") == "mixture":
        return "a mixture of experts: compared by validation_5d.py"
    if not row.get("usable"):
        return "marked not usable in the file (not a TP x PP x DP configuration)"
    if row.get("precision") == "fp8" or (row.get("cp") or 1) > 1:
        return "FP8 or context parallelism: compared apart, by validation_5d.py (this set is bf16 3D)"
    if row.get("arch") not in ("gpt3", "llama", "bloom"):
        return "the model's architecture is not stated"
    merged = {**row, **READINGS.get(row["id"], ({}, ""))[0]}
    missing = [k for k in ("tp", "pp", "dp", "microbatch", "global_batch", "recompute", "virtual_stages")
               if merged.get(k) is None]
    return f"its source leaves {', '.join(missing)} unstated" if missing else None


def _spec(row: dict):
    if row["arch"] == "llama":
        return llama(row["id"], row["hidden"], row["layers"], row["heads"], row["kv_heads"], row["ffn"], row["vocab"],
                     row["seq"])
    return gpt(row["id"], row["hidden"], row["layers"], row["heads"], row["seq"], row["vocab"], row["ffn"])


def _metric(row: dict) -> tuple[str, float]:
    pub = row["published"]
    if pub.get("iteration_s"):
        return "iteration_s", float(pub["iteration_s"])
    if pub.get("tflops_per_gpu"):
        kind = "hw" if pub.get("flops_count") == "hardware" else "model"
        return f"{kind}_tflops_per_gpu", float(pub["tflops_per_gpu"])
    return "mfu", float(pub["mfu"])


def run_of(row: dict) -> Run:
    """A usable row as pipeplan inputs (``_why_excluded`` is None)."""
    extra, why = READINGS.get(row["id"], ({}, None))
    r = {**row, **extra}
    spec = _spec(r)
    v = r["virtual_stages"]
    stages = r.get("stage_layers")
    layout = chunked(tuple(stages), v) if stages else candidates(spec.layers, r["pp"], v)[0]
    zero = 1 if r.get("distributed_optimizer") in ("zero1", "fsdp") else 0
    grad = "bf16" if r.get("precision") == "fp16" else "fp32"  # fp16 Megatron reduced 16-bit gradients
    par = Parallelism(r["tp"], r["pp"], r["dp"], layout, v, microbatch=r["microbatch"], recompute=r["recompute"],
                      sp=bool(r.get("sequence_parallel")) and r["tp"] > 1, zero=zero, grad_reduce=grad,
                      overlap_grad_reduce=zero == 1 and r["dp"] > 1,
                      schedule="interleaved-1f1b" if v > 1 else "1f1b")
    kind = "h100" if r["gpu"] == "H100-SXM" else "a100"
    cluster = load_cluster(f"dgx-{kind}x{math.ceil(r['gpus'] / 8)}")
    metric, value = _metric(r)
    return Run(r["id"], r["source"], build_graph(spec, 1), cluster, par, r["global_batch"], metric, value, why)


def load() -> tuple[list[Run], list[tuple[str, str]]]:
    """The usable runs and the (id, why) of every row left out."""
    rows = yaml.load(DATA.read_text(), Loader=yaml.CSafeLoader)["rows"]  # libyaml: 10x the pure-Python loader
    runs, out = [], []
    for row in rows:
        why = _why_excluded(row)
        if why is None:
            runs.append(run_of(row))
        else:
            out.append((row["id"], why))
    return runs, out


def predict(run: Run) -> SimResult:
    plan = llm3d.plan_of(run.graph, run.cluster, run.par, run.global_batch)
    return simulate(plan, timeline=False)


def error(run: Run, result: SimResult) -> float:
    """Predicted against published throughput, as a fraction (> 0: predicted faster)."""
    if run.metric == "iteration_s":
        return run.published / result.iteration_s - 1.0
    return float(result.extra[run.metric]) / run.published - 1.0
