"""Would the quick tests notice a broken LLM path? Each single-line mutation below (the search,
its estimate and completeness, the cost terms, memory, the exports, pins, explain) is applied to
a copy of the source, then the LLM path's quick tests run against that copy; a mutation
survives when they all pass. The score is the share caught (issue 40: at least 90%).

    python benchmarks/llm_mutations.py [--only NAME] [--out DIR]

Writes benchmarks/results/llm/mutations.json (per mutation: caught, the first failing test).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mutations import apply, run_all  # noqa: E402
from _results import add_out_argument, write_json  # noqa: E402

TESTS = ["tests/test_llm_parallel.py", "tests/test_llm_costs.py", "tests/test_llm_pins.py", "tests/test_llm_memory.py",
         "tests/test_llm_scale.py", "tests/test_llm_spec.py", "tests/test_explain.py", "tests/test_engines_megatron.py",
         "tests/test_published_runs.py"]
L3, TG, LC, SPEC, STEP = ("pipeplan/planners/llm3d.py", "pipeplan/sim/tensor_groups.py", "pipeplan/llm/costs.py",
                          "pipeplan/llm/spec.py", "pipeplan/llm/step_costs.py")
MEG, PAR, LAY = "pipeplan/engines/megatron.py", "pipeplan/llm/parallelism.py", "pipeplan/llm/layout.py"
#: name -> (file under src/, the text replaced, its replacement)
EDITS = {
    # the search, its estimate and its completeness
    "search always complete": (L3, '"complete": set(cands) <= done}', '"complete": True}'),
    "simulate the worst screened": (L3, "chosen = [c for c, _ in rows[:simulations]]",
                                    "chosen = [c for c, _ in rows[-simulations:]]"),
    "estimate: bubble ignores chunks": (L3, "bubble = (par.pp - 1) / par.vpp / (", "bubble = (par.pp - 1) / ("),
    "estimate: no sends": (L3, "iteration = (m + bubble) * slowest + m * sends + ar",
                           "iteration = (m + bubble) * slowest + ar"),
    "estimate: no data-parallel term": (L3, "iteration = (m + bubble) * slowest + m * sends + ar",
                                        "iteration = (m + bubble) * slowest + m * sends"),
    "estimate: one microbatch in flight": (L3, "_in_flight(par, s, m) * n * kept", "n * kept"),
    "estimate: fits the whole memory": (L3, "memory <= float(cluster.usable.min())",
                                        "memory <= float(cluster.memory.min())"),
    "TP beyond the key/value rule": (L3, "and (spec.kv_heads % t == 0 or t % spec.kv_heads == 0)]", "]"),
    "SP allowed with TP 1": (L3, "if (sp and t == 1) or", "if (sp and t == 0) or"),
    "rule of thumb: smallest TP": (L3, "sorted(degrees, reverse=True)", "sorted(degrees)"),
    "pins: none means unset": ("pipeplan/planners/options.py",
                               'if optional and text.strip().lower() == "none" and "none" not in (choices or ()):',
                               'if optional and text.strip().lower() == "none":'),
    "parallelism: any key/value heads": (PAR, "if spec.kv_heads % self.tp and self.tp % spec.kv_heads:", "if False:"),
    "plan: parallelism unchecked": (LAY, "    if wrong:\n", "    if False:\n"),
    # cost terms
    "fp32 gradients priced as 16-bit": (PAR, 'DTYPE_BYTES = {"fp32": 4, "bf16": 2}', 'DTYPE_BYTES = {"fp32": 2, "bf16": 2}'),
    "ZeRO-1 without its all-gather": (STEP, '                + collective_s("all_gather", params_per_rank * BF16, dp, *links))',
                                      "                )"),
    "collectives without latency": ("pipeplan/cluster/collectives.py",
                                    "return math.ceil(math.log2(n)) * rounds if n > 1 else 0", "return 0"),
    "backward all-reduces all hidden": (LC, 'return max(0.0, 2 * collective_s("all_reduce", nbytes, tp, bus, latency) - gemm)',
                                        "return 0.0"),
    "SP output gathers hidden": (LC, "waiting = 2 * collective_s(", "waiting = 0 * collective_s("),
    "recomputed forward's collectives free": (LC, 'bwd_comm += fwd_comm if recompute == "full" else 0.0',
                                              "bwd_comm += 0.0"),
    "optimizer step 10x cheaper": (STEP, '"adam": 42.0', '"adam": 4.2'),
    "sends never block": (TG, "meta[BLOCKING_SENDS] = plan.parallelism is not None and not plan.parallelism.overlap_p2p",
                          "meta[BLOCKING_SENDS] = False"),
    "data-parallel ring on one adapter": (STEP, "    return group_links(cluster, ring)\n",
                                          "    return group_links(cluster, ring[:1] + ring[-1:])\n"),
    "tied embedding reduction free": (TG, "return [tied_reduction_s(spec, plan.cluster, st.tp, grad, first, last)",
                                      "return [0 * tied_reduction_s(spec, plan.cluster, st.tp, grad, first, last)"),
    "tied embedding copy free": (TG, 'params[g.index["head"]] += BF16 * spec.vocab * spec.hidden',
                                 'params[g.index["head"]] += 0'),
    "key/value replication free": (SPEC, "return 2 * self.hidden * (tp * self.kv_rank(tp) - self.kv_dim)", "return 0"),
    "norm backward as cheap as forward": (LC, "norm, add, drop = ((3, 3, 2 * BF16 + 1) if backward",
                                          "norm, add, drop = ((2, 3, 2 * BF16 + 1) if backward"),
    "attention backward traffic as forward": (SPEC, "per_score = (2 + 2 + drop + 6 + 4) if backward",
                                              "per_score = (2 + 4 + drop + 2) if backward"),
    "SP does not shard activations": (SPEC, "return replicated / (tp if sp else 1) + split / tp + keys_values",
                                      "return replicated + split / tp + keys_values"),
    # memory
    "no memory reserve": ("pipeplan/cluster/kinds.py", "return context + nccl + fragmentation * self.memory",
                          "return 0.0"),
    "groups get the whole memory": (TG, "float(cl.usable[g].min()) * len(g)", "float(cl.memory[g].min()) * len(g)"),
    # exports
    "layout string E and L swapped": (MEG, 'return f"E{chunk(counts[0])}|" + "".join(middle) + f"{chunk(counts[-1])}L"',
                                      'return f"L{chunk(counts[0])}|" + "".join(middle) + f"{chunk(counts[-1])}E"'),
    "bf16 reduction flag inverted": (MEG, '("--grad-reduce-in-bf16", v.grad_reduce == "bf16")',
                                     '("--grad-reduce-in-bf16", v.grad_reduce == "fp32")'),
    "p2p overlap flag inverted": (MEG, '("--no-overlap-p2p-communication", v.vpp > 1 and not v.overlap_p2p)',
                                  '("--no-overlap-p2p-communication", v.vpp > 1 and v.overlap_p2p)'),
    "first stage's layers wrong": (MEG, '[f"--decoder-first-pipeline-num-layers {stages[0]}"]',
                                   '[f"--decoder-first-pipeline-num-layers {stages[1]}"]'),
    # explain
    "explain: sends as bubble": ("pipeplan/sim/explain.py", 'terms["pipeline_sends"] += min(waited, b - a)',
                                 'terms["pipeline_sends"] += 0.0'),
    "explain: TP collectives as compute": ("pipeplan/sim/explain.py",
                                           '_COMPUTE = {int(Kind.F): (("forward", "fwd"), ("tp_comm", "fwd_tp")),',
                                           '_COMPUTE = {int(Kind.F): (("forward", "fwd"), ("forward", "fwd_tp")),'),
}


def mutate(name: str, src: Path) -> None:
    apply(EDITS, name, src, "benchmarks/llm_mutations.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the mutations whose name contains this (writes nothing)")
    add_out_argument(parser, "llm")
    args = parser.parse_args()
    names = [n for n in EDITS if args.only is None or args.only in n]
    rows = run_all(names, mutate, TESTS, "LLM", 40)
    score = sum(r["caught"] for r in rows.values()) / len(rows)
    print(f"mutation score {score:.0%} ({sum(r['caught'] for r in rows.values())} of {len(rows)})")
    if args.only is None:
        write_json(args.out / "mutations.json", {"tests": TESTS, "mutations": rows, "score": score})


if __name__ == "__main__":
    main()
