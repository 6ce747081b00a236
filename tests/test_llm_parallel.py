"""Tensor x pipeline x data parallelism of decoder LLMs (docs/llm.md): plans with ``tp`` per
stage, costed on their tensor-parallel groups, against closed forms from the decoder's
dimensions and Megatron-LM's formulas."""

from __future__ import annotations

import json
import re

import pytest

from pipeplan.cluster import load_cluster
from pipeplan.errors import PipeplanError
from pipeplan.graph import load_graph
from pipeplan.llm.spec import gpt
from pipeplan.llm.layout import candidates, stage_counts
from pipeplan.llm.parallelism import Parallelism
from pipeplan.plan import Plan, Stage, plan_from_dict
from pipeplan.planners import llm3d
from pipeplan.llm import costs as llm_costs
from pipeplan.sim import simulate
from pipeplan.cluster.collectives import group_links
from pipeplan.sim.formulas import state_bytes
from pipeplan.llm.rank_costs import Cut, Links, node_costs
from pipeplan.sim.tensor_groups import group_cluster

from pipeplan.cluster.kinds import kind

SMALL = "zoo:gpt?hidden=1024&layers=4&heads=16&seq=512&vocab=8192"
H100 = kind("H100-SXM")


def one_stage(graph, cluster, tp, devices=None, microbatches=4, **kw) -> Plan:
    devices = devices or cluster.names[:tp]
    return Plan(graph, cluster, [Stage(list(graph.ids), devices, tp)], microbatches, replicas="round-robin", **kw)


def test_one_tensor_parallel_group_runs_each_microbatch_in_the_layers_closed_form_time():
    """One stage on one TP group of 8: the iteration is M x (embed + layers + head) of one rank,
    each the kernel-level compute over END_TO_END plus Megatron's collectives."""
    g, c = load_graph(SMALL + "&microbatch=2"), load_cluster("dgx-h100x1")
    spec = llm3d.spec_of(g)
    links = group_links(c, range(8))
    layer = llm_costs.layer_cost(spec, H100, 2, 8, False, "none", *links)
    per_layer = (layer.fwd_s + layer.bwd_s) / llm_costs.END_TO_END + layer.fwd_comm_s + layer.bwd_comm_s
    ends = sum(sum(node_costs(spec, role, H100, 2, Cut(8), "none", Links(links))[:2]) for role in ("embed", "head"))
    step = 42 * spec.total_params() / 8 / 3350e9  # Adam: 42 bytes a parameter through the H100's HBM, 1/8 a rank
    r = simulate(one_stage(g, c, 8), timeline=False)
    assert r.iteration_s == pytest.approx(4 * (spec.layers * per_layer + ends) + step, rel=1e-9)
    assert r.devices == ["s0g0..s0g7"] and r.members == {"s0g0..s0g7": c.names}


def test_per_gpu_memory_is_the_state_over_tp_plus_what_one_microbatch_keeps():
    """1F1B on one stage keeps one microbatch in flight: 18 bytes a parameter / t plus the
    layers' activations per rank (Korthikanti's count) and the head's."""
    g, c = load_graph(SMALL + "&microbatch=2"), load_cluster("dgx-h100x1")
    spec = llm3d.spec_of(g)
    r = simulate(one_stage(g, c, 4), timeline=False)
    state = state_bytes(2.0 * spec.total_params(), "adam", "bf16") / 4
    kept = spec.layers * spec.layer_activation_bytes(2, 4, False, "none") \
        + node_costs(spec, "head", H100, 2, Cut(4), "none", Links(group_links(c, range(4))))[2]
    assert r.memory_bytes[0] == pytest.approx(state + kept, rel=0.02)
    # usable: 80 GiB less the reserve (0.75 GiB context + 1.25 GiB NCCL + 3% fragmentation)
    assert r.memory_limit[0] == pytest.approx((80 - 0.75 - 1.25 - 0.03 * 80) * 2**30, rel=1e-12)


def test_zero1_shards_master_weights_and_adam_states_over_the_replicas():
    """ZeRO-1 over d replicas saves 12 (1 - 1/d) bytes a parameter per rank: 18 -> 6 + 12/d; its
    reduce-scatter of fp32 gradients and all-gather of bf16 weights move 6 (d-1)/d bytes a
    parameter where the fp32 all-reduce moves 8 (d-1)/d, and each rank steps 1/d of the
    parameters (42 bytes each through HBM: Megatron's step)."""
    g, c = load_graph(SMALL), load_cluster("dgx-h100x1")
    base = simulate(one_stage(g, c, 2, devices=c.names), timeline=False)
    zero = simulate(one_stage(g, c, 2, devices=c.names, zero=1), timeline=False)
    params = llm3d.spec_of(g).total_params()
    assert base.memory_bytes[0] - zero.memory_bytes[0] == pytest.approx(12 * params * (1 - 1 / 4) / 2, rel=1e-9)
    rank, d, bus = params / 2, 4, 450e9 * 0.8  # TP 2; 4 replicas on one server's NVLink at NCCL's 80%
    saved_comm = (2 * (d - 1) / d * 4 * rank - (d - 1) / d * 6 * rank) / bus
    saved_step = 42 * rank * (1 - 1 / d) / 3350e9
    assert base.iteration_s - zero.iteration_s == pytest.approx(saved_comm + saved_step, rel=1e-6)


def test_overlapping_the_gradient_all_reduce_hides_up_to_the_last_backward():
    """One stage, 4 replicas of TP 2: the iteration is 2 microbatches' forward and backward and
    the all-reduce; overlapped, only what outlasts one microbatch's backward remains."""
    g, c = load_graph(SMALL), load_cluster("dgx-h100x1")
    spec = llm3d.spec_of(g)
    links = group_links(c, range(2))
    per = [node_costs(spec, role, H100, 1, Cut(2), "none", Links(links))
           for role in ["embed"] + ["layer"] * spec.layers + ["head"]]
    fwd, bwd = sum(p[0] for p in per), sum(p[1] for p in per)
    base = simulate(one_stage(g, c, 2, devices=c.names, microbatches=8), timeline=False)
    step = 42 * spec.total_params() / 2 / 3350e9  # Adam through one H100's HBM, half the parameters a rank
    ar = base.iteration_s - 2 * (fwd + bwd) - step
    assert ar > 0
    over = simulate(one_stage(g, c, 2, devices=c.names, microbatches=8, overlap_grad_reduce=True), timeline=False)
    assert over.iteration_s == pytest.approx(base.iteration_s - min(ar, bwd), rel=1e-9)


def test_a_microbatch_split_into_fractions_of_a_sample_is_refused():
    g, c = load_graph(SMALL), load_cluster("dgx-h100x1")
    plan = Plan(g, c, [Stage(list(g.ids), c.names[:4], 2)], 4, replicas="split")
    with pytest.raises(PipeplanError, match="not whole samples"):
        simulate(plan)
    ok = Plan(load_graph(SMALL + "&microbatch=2"), c, [Stage(list(g.ids), c.names[:4], 2)], 4, replicas="split")
    assert simulate(ok, timeline=False).iteration_s > 0


def test_group_links_are_the_rails_of_their_rank_pairs():
    """Two groups of 8 on two DGX servers: 8 InfiniBand rails; inside one server, NVLink."""
    c = load_cluster("dgx-h100x2")
    gc = group_cluster(c, [list(range(8)), list(range(8, 16))])
    assert gc.bandwidth[0, 1] == 8 * c.bandwidth[0, 8] and gc.latency[0, 1] == c.latency[0, 8]
    gc = group_cluster(c, [[0, 1], [2, 3], [8, 9, 10, 11]])
    assert gc.bandwidth[0, 1] == 2 * c.bandwidth[0, 2] and gc.bandwidth[1, 2] == 2 * c.bandwidth[2, 8]
    assert gc.memory.tolist() == [2 * c.usable[0], 2 * c.usable[0], 4 * c.usable[0]]  # the GPUs' usable memory


@pytest.mark.parametrize("h, layers, heads, batch", [(2304, 24, 24, 512), (12288, 96, 96, 1536)])
def test_hardware_flops_with_full_recomputation_are_megatrons_eq3(h, layers, heads, batch):
    """Narayanan et al. 2021 Eq. 3: 96 B s l h^2 (1 + s / 6h + V / 16lh) a iteration."""
    g, c = load_graph(f"zoo:gpt?hidden={h}&layers={layers}&heads={heads}"), load_cluster("dgx-a100x2")
    cfg = Parallelism(8, 2, 1, (layers // 2, layers // 2), recompute="full")
    plan = llm3d.plan_of(g, c, cfg, batch // 8)
    r = simulate(plan, timeline=False)
    s, v, b = 2048, 51200, batch // 8
    eq3 = 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    assert r.extra["hw_tflops_per_gpu"] * 1e12 * r.iteration_s * 16 == pytest.approx(eq3, rel=0.01)
    spec = llm3d.spec_of(g)  # the layers' forward again; the head is not recomputed
    again = layers * spec.layer_flops(1) / (3 * (layers * spec.layer_flops(1) + spec.head_flops(1)))
    assert r.extra["hw_tflops_per_gpu"] / r.extra["model_tflops_per_gpu"] == pytest.approx(1 + again, rel=1e-9)
    assert r.extra["mfu"] == pytest.approx(r.extra["model_tflops_per_gpu"] * 1e12 / 312e12)


def test_plan_json_round_trips_the_parallelism_and_refuses_it_elsewhere(tmp_path):
    g, c = load_graph(SMALL), load_cluster("dgx-h100x1")
    plan = one_stage(g, c, 4, devices=c.names, selective=True, sequence_parallel=True, zero=1)
    back = plan_from_dict(json.loads(json.dumps(plan.to_dict())))
    assert [s.tp for s in back.stages] == [4] and back.selective and back.sequence_parallel and back.zero == 1
    assert not back.overlap_grad_reduce
    d = plan.to_dict()
    d["stages"][0]["tp"] = 3
    with pytest.raises(PipeplanError, match="not a multiple of its tp 3"):
        plan_from_dict(d)
    d["stages"][0]["tp"] = "8"
    with pytest.raises(PipeplanError, match="tp must be an integer"):
        plan_from_dict(d)
    chain = load_graph("zoo:vgg16")
    with pytest.raises(PipeplanError, match="decoder LLM graphs only"):
        Plan(chain, c, [Stage(list(chain.ids), c.names[:2], 2)], 4)


def test_tensor_parallelism_on_gpus_without_bf16_rates_is_refused():
    g = load_graph(SMALL)
    c = load_cluster("hier:servers=1,gpus=4,intra=100Gbps,inter=10Gbps")
    with pytest.raises(PipeplanError, match="bf16 rates"):
        simulate(one_stage(g, c, 2, devices=c.names))


def test_every_configuration_is_realizable():
    """Megatron-LM's rules, checked here independently of the search (docs/megatron-rules.md):
    TP divides a server's GPUs, the heads and the key/value heads; the layout's PP x v chunks
    hold every layer; without interleaving the middle stages are equal and the first and last
    at most as heavy; interleaving runs a multiple of PP microbatches a replica."""
    spec, c = gpt("g", 4096, 24, 32, kv_heads=4), load_cluster("dgx-a100x4")
    cfgs = llm3d.configs(spec, c, 256)
    assert cfgs and len(set(cfgs)) == len(cfgs)
    for cfg in cfgs:
        assert 8 % cfg.tp == 0 and spec.heads % cfg.tp == 0 and cfg.tp * cfg.pp * cfg.dp == 32
        assert 4 % cfg.tp == 0 or cfg.tp % 4 == 0  # key/value heads split or replicated (Megatron-core)
        assert 256 % (cfg.dp * cfg.microbatch) == 0 and cfg.pp <= spec.layers
        assert len(cfg.layout) == cfg.pp * cfg.vpp and sum(cfg.layout) == spec.layers and min(cfg.layout) >= 1
        stages = [sum(cfg.layout[s::cfg.pp]) for s in range(cfg.pp)]
        if cfg.pp > 2:
            assert len(set(stages[1:-1])) == 1 and max(stages[0], stages[-1]) <= stages[1]
        if cfg.vpp > 1:
            assert cfg.schedule == "interleaved-1f1b" and (256 // (cfg.dp * cfg.microbatch)) % cfg.pp == 0
        assert cfg.sp == (cfg.tp > 1) and cfg.overlap_grad_reduce == (cfg.dp > 1) and cfg.grad_reduce == "fp32"
        assert cfg.overlap_p2p == (cfg.vpp > 1) and (cfg.vpp == 1 or cfg.pp >= 2)
    assert {cfg.tp for cfg in cfgs} == {1, 2, 4, 8} and {cfg.recompute for cfg in cfgs} == {"none", "selective", "full"}
    assert any(len(set(cfg.layout)) > 1 for cfg in cfgs)  # uneven layouts are searched too


@pytest.mark.parametrize("layers, pp, counts", [
    (126, 16, (7,) + (8,) * 14 + (7,)),  # Llama 3 405B's split (Dubey et al. 2024 §3.3.2)
    (30, 4, (7, 8, 8, 7)), (7, 2, (4, 3)), (7, 2, (3, 4)), (80, 4, (20,) * 4),
    (13, 4, (2, 4, 4, 3)), (13, 4, (3, 4, 4, 2)),  # first and last chosen independently
])
def test_stage_layer_counts_include_the_published_and_uneven_splits(layers, pp, counts):
    assert counts in stage_counts(layers, pp)


def test_llama3_405b_interleaved_layout_puts_one_layer_less_on_the_first_and_last_stage():
    """126 layers, 16 stages of 2 chunks: positions 0 and 15 hold 3 + 4 layers, the others 4 + 4,
    the lighter chunk where the embedding (chunk 0) or the head (chunk 31) rides."""
    lay = (3,) + (4,) * 30 + (3,)
    assert lay in candidates(126, 16, 2)
    assert [lay[s] + lay[s + 16] for s in range(16)] == [7] + [8] * 14 + [7]
    # V = 8: "the first model chunk on the first stage has only the embedding, and the last model
    # chunk on the last stage has only output projection and loss calculation" (Dubey et al. 2024)
    assert candidates(126, 16, 8) == [(0,) + (1,) * 126 + (0,)]


def test_the_screening_estimate_is_near_the_simulation():
    """The closed form screens; it stays within 15% of the simulated iteration on uniform plans."""
    g, c = load_graph("zoo:gpt?hidden=4096&layers=32&heads=32"), load_cluster("dgx-a100x4")
    spec = llm3d.spec_of(g)
    for cfg in (Parallelism(8, 4, 1, (8,) * 4, recompute="selective", sp=True),
                Parallelism(4, 2, 4, (8,) * 4, 2, microbatch=2, recompute="full", zero=1, sp=True,
                            schedule="interleaved-1f1b"),
                Parallelism(2, 1, 16, (32,), microbatch=4, zero=1, sp=True)):
        est = llm3d.estimate(spec, c, cfg, 256)
        r = simulate(llm3d.plan_of(g, c, cfg, 256), timeline=False)
        assert est.iteration_s == pytest.approx(r.iteration_s, rel=0.15)
        assert est.memory_bytes == pytest.approx(float(r.memory_bytes.max()), rel=0.15)


@pytest.mark.slow
def test_joint_is_the_best_of_every_configuration_simulated():
    """With a budget for all of them, joint's 3D plan is the fastest fitting configuration of
    an independent brute force over the configurations, each simulated."""
    from pipeplan.planners.base import PlanOptions, planner_settings, run_planner

    g, c = load_graph(SMALL), load_cluster("dgx-h100x1")
    cfgs = llm3d.configs(llm3d.spec_of(g), c, 32)
    times = []
    for cfg in cfgs:
        r = simulate(llm3d.plan_of(g, c, cfg, 32), timeline=False)
        if not r.over_memory:
            times.append(r.iteration_s)
    settings = planner_settings(["joint"], [("simulations", str(len(cfgs)))])
    plan, res = run_planner("joint", g, c, PlanOptions(global_batch=32, settings=settings))
    assert plan.extra["joint"]["complete"] and plan.extra["joint"]["configurations"] == len(cfgs)
    assert res.iteration_s == pytest.approx(min(times), rel=1e-12)


def test_megatron_pins_every_dimension_and_takes_its_rules_for_the_rest(capsys):
    from pipeplan.cli import main

    assert main(["plan", "--model", "zoo:gpt?hidden=4096&layers=32&heads=32", "--cluster", "dgx-a100x4",
                 "--global-batch", "256", "--planner", "megatron", "-O", "tp=4", "-O", "pp=2", "-O", "vpp=2",
                 "-O", "microbatch=2", "-O", "recompute=selective", "-O", "zero=1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    p = out["parallelism"]
    assert (p["tp"], p["pp"], p["dp"], p["vpp"], p["microbatch"], p["recompute"], p["zero"]) == \
        (4, 2, 4, 2, 2, "selective", 1)
    assert all(s["tp"] == 4 for s in out["stages"]) and len(out["stages"]) == 4
    assert out["microbatches"] * 2 == 256 == out["global_batch"]
    assert p["layout"] == [8, 8, 8, 8] and "megatron_args" not in p  # the arguments come from engines.megatron
    for key in ("model_tflops_per_gpu", "hw_tflops_per_gpu", "mfu"):
        assert out["prediction"][key] > 0
    assert main(["plan", "--model", "zoo:gpt?hidden=4096&layers=32&heads=32", "--cluster", "dgx-a100x4",
                 "--global-batch", "256", "--planner", "megatron", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)["parallelism"]
    assert (p["tp"], p["microbatch"], p["sp"], p["zero"]) == (8, 1, True, 1)


@pytest.mark.parametrize("argv, words", [
    (["-O", "tp=3"], "tp=3: TP must divide a server's 8 GPUs"),
    (["-O", "pp=64"], "pp=64: PP must divide the 32 GPUs"),
    (["-O", "tp=1", "-O", "sp=true"], "sp=true: sequence parallelism needs TP > 1"),
    (["-O", "recompute=some"], "recompute"),
])
def test_megatron_pins_that_cannot_run_are_one_line(argv, words, capsys):
    from pipeplan.cli import main

    assert main(["plan", "--model", "zoo:gpt?hidden=4096&layers=32&heads=32", "--cluster", "dgx-a100x4",
                 "--global-batch", "256", "--planner", "megatron", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_megatron_llm_options_on_another_graph_are_refused(capsys):
    from pipeplan.cli import main

    assert main(["plan", "--model", "zoo:vgg16", "--cluster", "hier:servers=1,gpus=4,intra=100Gbps,inter=10Gbps",
                 "--planner", "megatron", "-O", "tp=2"]) == 2
    assert "for decoder LLM graphs" in capsys.readouterr().err


@pytest.mark.slow
def test_the_llama3_70b_plan_on_512_h100s_shows_3d_memory_bubble_and_megatron_arguments(capsys):
    """The issue's command: a TP x PP x DP plan, per-GPU memory that fits, the bubble, and
    Megatron-LM's arguments."""
    from pipeplan.cli import main

    assert main(["plan", "--model", "zoo:llama3-70b", "--cluster", "dgx-h100x64", "--global-batch", "1024",
                 "--planner", "joint"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\dD: TP \d+ x ", out) and " x PP " in out and " x DP " in out
    assert "per GPU: peak memory" in out and "bubble" in out and "MFU" in out
    assert "Megatron-LM: --tensor-model-parallel-size" in out and "--micro-batch-size" in out
    assert "OVER" not in out


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["graph"]["meta"].__setitem__("decoder", {"foo": 1}), "unknown key 'foo'"),
    (lambda d: d["graph"]["meta"].__setitem__("decoder", "x"), "must be an object"),
    (lambda d: d["graph"]["meta"]["decoder"].__setitem__("gated", "no"), "'gated' must be true or false"),
    (lambda d: d["graph"]["meta"]["decoder"].pop("hidden"), "lacks 'hidden'"),
    (lambda d: d["graph"]["meta"]["decoder"].__setitem__("heads", 3), "not a multiple of heads 3"),
    (lambda d: d["stages"][0].__setitem__("tp", 0), "tp 0"),
    (lambda d: d.__setitem__("zero", 2), "zero must be 0 or 1"),
    (lambda d: d.__setitem__("selective_recompute", "yes"), "selective_recompute must be true or false"),
    (lambda d: d["cluster"]["devices"][0].__setitem__("kind", "V100"), "bf16 rates"),
])
def test_hostile_tensor_parallel_plans_are_one_line(tmp_path, capsys, edit, words):
    from pipeplan.cli import main

    base = tmp_path / "base.json"
    assert main(["plan", "--model", "zoo:gpt?hidden=512&layers=4&heads=8&seq=256&vocab=4096", "--cluster",
                 "dgx-h100x1", "--planner", "megatron", "-O", "tp=2", "-O", "pp=2", "--global-batch", "8",
                 "--out", str(base)]) == 0
    d = json.loads(base.read_text())
    edit(d)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    capsys.readouterr()
    assert main(["simulate", str(bad), "--trace", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and not (tmp_path / "t.json").exists()


def test_key_value_heads_fewer_than_the_ranks_are_replicated_and_priced_so():
    """TP 8 over 2 key/value heads (Megatron-core replicates them): each rank computes and
    holds one whole key/value head, not a quarter of one."""
    from pipeplan.llm.costs import gemm_flops as _gemm_flops

    spec = gpt("g", 4096, 4, 32, kv_heads=2, seq=1024)
    head_dim, tokens = 4096 // 32, 1024
    assert _gemm_flops(spec, tokens, 8)[0] == 2.0 * tokens * 4096 * (4096 / 8 + 2 * head_dim)
    assert spec.kv_replicated_params(8) == 2 * 4096 * (8 * head_dim - 2 * head_dim)
    assert spec.kv_replicated_params(2) == 0
    naive = spec.layer_activation_bytes(1, 8) - 2 * 2 * 1024 * head_dim + 2 * 2 * 1024 * 2 * head_dim / 8
    assert spec.layer_activation_bytes(1, 8) > naive
    g, c = load_graph("zoo:gpt?hidden=4096&layers=4&heads=32&kv_heads=2&seq=1024"), load_cluster("dgx-h100x1")
    assert 8 in llm3d.tp_degrees(llm3d.spec_of(g), c)
    plan = llm3d.plan_of(g, c, Parallelism(8, 1, 1, (4,), sp=True), 8)
    r = simulate(plan, timeline=False)
    assert r.iteration_s > 0
    with pytest.raises(PipeplanError, match="neither split over nor replicate"):
        gpt("g", 6144, 4, 48, kv_heads=4).kv_rank(6)


@pytest.mark.parametrize("vpp", [1, 2, 4])
def test_the_estimate_follows_the_bubble_where_it_matters(vpp):
    """4 positions, 4 microbatches a replica (the bubble is (PP - 1) / v of 4 + (PP - 1) / v
    rounds): the screening estimate stays within 10% of the simulation at every v, so the
    search ranks interleaving by what it saves."""
    g, c = load_graph("zoo:gpt?hidden=2048&layers=16&heads=16"), load_cluster("dgx-a100x1")
    spec = llm3d.spec_of(g)
    cfg = Parallelism(2, 4, 1, (16 // (4 * vpp),) * (4 * vpp), vpp, sp=True,
                      schedule="interleaved-1f1b" if vpp > 1 else "1f1b")
    est = llm3d.estimate(spec, c, cfg, 4)
    r = simulate(llm3d.plan_of(g, c, cfg, 4), timeline=False)
    assert est.iteration_s == pytest.approx(r.iteration_s, rel=0.10)


@pytest.mark.parametrize("tp, pp, dp", [(1, 4, 1), (1, 1, 4)])
def test_the_estimate_prices_blocking_sends_and_the_data_parallel_ring(tp, pp, dp):
    """On 1 Gb/s links between single-GPU servers the pipeline's blocking sends (PP 4) or the
    data-parallel reduction (DP 4) dominate the iteration: the estimate stays within 15% of
    the simulation, so it cannot leave either out."""
    g = load_graph("zoo:gpt?hidden=1024&layers=8&heads=16&seq=512&vocab=8192")
    c = load_cluster("hier:servers=4,gpus=1,intra=100Gbps,inter=1Gbps,kind=A100-80GB")
    spec = llm3d.spec_of(g)
    cfg = Parallelism(tp, pp, dp, (8 // pp,) * pp, zero=int(dp > 1), overlap_grad_reduce=dp > 1)
    est = llm3d.estimate(spec, c, cfg, 8)
    r = simulate(llm3d.plan_of(g, c, cfg, 8), timeline=False)
    assert est.iteration_s == pytest.approx(r.iteration_s, rel=0.15)


def test_the_estimate_fits_only_under_the_usable_memory():
    """fits = the estimate's memory <= the GPU's memory less the reserve, the reserve as given."""
    g, c = load_graph("zoo:gpt?hidden=4096&layers=8&heads=32"), load_cluster("dgx-a100x1")
    spec, cfg = llm3d.spec_of(g), Parallelism(8, 1, 1, (8,), sp=True)
    need = llm3d.estimate(spec, c.with_reserve(0.0), cfg, 8).memory_bytes
    room = float(c.memory.min())
    assert llm3d.estimate(spec, c.with_reserve(room - need + 2**30), cfg, 8).fits is False
    assert llm3d.estimate(spec, c.with_reserve(room - need - 2**30), cfg, 8).fits is True


def test_tp_follows_megatron_cores_key_value_rule():
    """24 heads over 3 key/value heads on 8-GPU servers: TP 2, 4 and 8 neither divide 3 nor are
    multiples of it, so only TP 1 (Megatron-core: num_query_groups a divisor or a multiple of TP)."""
    c = load_cluster("dgx-a100x1")
    assert llm3d.tp_degrees(gpt("g", 3072, 4, 24, kv_heads=3), c) == [1]
    assert llm3d.tp_degrees(gpt("g", 3072, 4, 24, kv_heads=24), c) == [1, 2, 4, 8]
    assert llm3d.tp_degrees(gpt("g", 3072, 4, 24, kv_heads=2), c) == [1, 2, 4, 8]  # 4 and 8 replicate


@pytest.mark.parametrize("key, value", [("tp", 4), ("recompute", "full"), ("microbatch", 2), ("layout", [5, 3])])
def test_a_plan_whose_stages_disagree_with_its_parallelism_is_refused(key, value):
    g, c = load_graph(SMALL), load_cluster("dgx-h100x1")
    d = llm3d.plan_of(g, c, Parallelism(2, 2, 2, (2, 2), sp=True, zero=1, overlap_grad_reduce=True), 16).to_dict()
    plan_from_dict(json.loads(json.dumps(d)))  # as written, it loads
    d["parallelism"][key] = value
    with pytest.raises(PipeplanError, match="disagree|holds|layout"):
        plan_from_dict(d)


def test_a_data_parallel_ring_gets_its_servers_rails():
    """TP 1, 16 replicas over 2 DGX A100s: each server's 8 ranks reduce over its 8 adapters
    (8 x 25 GB/s at NCCL's 80%), not one: the fp32 all-reduce of every parameter takes
    2 x 15/16 x 4 bytes x P / (8 x 25e9 x 0.8) + 2 log2(16) x 6 us."""
    from pipeplan.sim.tensor_groups import lower

    g, c = load_graph(SMALL), load_cluster("dgx-a100x2")
    plan = llm3d.plan_of(g, c, Parallelism(1, 1, 16, (4,)), 16)
    fixed = lower(plan).plan.graph.meta["stage_allreduce_s"]
    params = llm3d.spec_of(g).total_params()
    assert fixed[0] == pytest.approx(2 * 15 / 16 * 4 * params / (8 * 25e9 * 0.8) + 2 * 4 * 6e-6, rel=1e-9)


def test_a_tied_embedding_split_over_first_and_last_stage_is_held_twice_and_reduced():
    """GPT's tied embedding with PP 2: the last stage keeps a copy (V x h 16-bit weights), and
    the first and last stage all-reduce its fp32 gradient between them (2 ranks of a server:
    (2 - 1)/2 x 2 x 4 bytes x V h / t over NVLink at 80%, plus 2 latencies) besides their
    data-parallel reduction."""
    from pipeplan.llm.spec import BF16
    from pipeplan.sim.tensor_groups import lower

    g, c = load_graph(SMALL), load_cluster("dgx-h100x1")
    spec = llm3d.spec_of(g)
    tied = lower(llm3d.plan_of(g, c, Parallelism(2, 2, 2, (2, 2), sp=True), 16)).plan.graph
    assert tied.params[tied.index["head"]] == BF16 * (spec.head_params() + spec.vocab * spec.hidden)
    tie = 2 * (1 / 2) * 4 * spec.vocab * spec.hidden / 2 / (450e9 * 0.8) + 2 * 1 * 3e-6
    one = lower(llm3d.plan_of(g, c, Parallelism(2, 1, 4, (4,), sp=True), 16)).plan.graph
    assert one.params[one.index["head"]] == BF16 * spec.head_params()  # one stage: no copy
    first, last = tied.meta["stage_allreduce_s"]
    ring = 2 * (1 / 2) * 4 / (450e9 * 0.8)  # 2 replicas, fp32, bytes a parameter a rank
    p_first = (spec.embedding_params() + 2 * spec.layer_params()) / 2
    p_last = (spec.head_params() + spec.vocab * spec.hidden + 2 * spec.layer_params()) / 2
    assert first == pytest.approx(ring * p_first + 2 * 3e-6, rel=1e-9)
    assert last == pytest.approx(ring * p_last + 2 * 3e-6, rel=1e-9)
    assert tied.meta["stage_step_extra_s"] == pytest.approx([tie, tie], rel=1e-9)  # before the step


def test_the_tied_embedding_is_reduced_without_data_parallelism_too():
    """PP 2, one replica: no data-parallel reduction, but the first and last stage still
    all-reduce the tied embedding's gradient before their step (explain: data-parallel term)."""
    from pipeplan.sim.explain import explain

    g, c = load_graph(SMALL), load_cluster("dgx-h100x1")
    spec = llm3d.spec_of(g)
    e = explain(llm3d.plan_of(g, c, Parallelism(4, 2, 1, (2, 2), sp=True), 8))
    tie = 2 * (1 / 2) * 4 * spec.vocab * spec.hidden / 4 / (450e9 * 0.8) + 2 * 1 * 3e-6
    assert e["terms"]["dp_comm"] == pytest.approx(tie, rel=1e-9)
