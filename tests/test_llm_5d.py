"""Context and expert parallelism (issue 43): a mixture's layer on one GPU against hand counts
(its parameters, what it keeps), context parallelism's exchange against its closed form, the
pins honored or refused in one line, and the Megatron arguments of CP and EP plans against
the option strings Megatron-LM's parser registers (tests/fixtures/megatron_arguments.json)."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from pipeplan.cli import main
from pipeplan.llm.experts import ExpertCut, experts_activation_bytes
from pipeplan.llm.rank_costs import Cut, cp_exchange_s, rank_params
from pipeplan.llm.spec import PRESETS

FIXTURE = Path(__file__).parent / "fixtures" / "megatron_arguments.json"
MIXTRAL = replace(PRESETS["mixtral-8x7b"], seq=4096)


def test_a_mixture_layers_parameters_on_a_rank_are_a_hand_count():
    """Mixtral 8x7B at TP 2, EP 4: attention 4096 x (4096 + 2 x 1024) + 4096 x 4096 and two
    RMSNorms over TP, the router (4096 x 8) whole; 8 / 4 experts of 3 x 4096 x 14336."""
    cut = Cut(tp=2, sp=True, experts=ExpertCut(ep=4))
    attention = 4096 * (4096 + 2 * 1024) + 4096 * 4096
    assert rank_params(MIXTRAL, True, cut) == ((attention + 2 * 4096) / 2 + 4096 * 8, 2 * 3 * 4096 * 14336)
    assert rank_params(MIXTRAL, True, replace(cut, experts=ExpertCut(ep=2, etp=2)))[1] == 4 * 3 * 4096 * 14336 / 2


def test_what_a_rank_keeps_for_its_experts_is_a_hand_count():
    """A microbatch of one 4,096-token sequence at TP 2: 2,048 tokens a rank, 2 copies each;
    a copy keeps its input (4,096 wide) and the gate, up and product (3 x 14,336), 16-bit; the
    router's fp32 scores over 8 experts a token; a busiest rank of skew 1.5 keeps 1.5 x the
    copies; full recomputation keeps none."""
    copies = 2048 * 2
    want = copies * 2 * (4096 + 3 * 14336) + 4 * 2048 * 8
    assert experts_activation_bytes(MIXTRAL, 1, 2, 1, ExpertCut(ep=4), "none") == want
    skewed = experts_activation_bytes(MIXTRAL, 1, 2, 1, ExpertCut(ep=4, skew=1.5), "none")
    assert skewed == 1.5 * copies * 2 * (4096 + 3 * 14336) + 4 * 2048 * 8
    assert experts_activation_bytes(MIXTRAL, 1, 2, 1, ExpertCut(ep=4), "full") == 0.0


def test_the_context_parallel_ring_exposes_what_a_send_outlasts_its_block():
    """Llama 3 8B at 8,192 tokens over CP 4, TP 1: a rank's key/value block is 2,048 tokens x
    (1,024 + 1,024) 16-bit values; 3 sends, each exposed by its excess over a quarter of the
    rank's attention; backward passes the block and its gradient; an all-gather of the 4
    blocks (and a reduce-scatter backward) otherwise."""
    spec = replace(PRESETS["llama3-8b"], seq=8192)
    block = 2 * 2048 * 2048
    bw, lat, core = 50e9, 5e-6, 1e-3
    fwd, bwd = cp_exchange_s(spec, 1, Cut(cp=4), (bw, lat), core)
    assert fwd == pytest.approx(3 * max(0.0, block / bw + lat - core / 4))
    assert bwd == pytest.approx(3 * max(0.0, 2 * block / bw + lat - 2 * core / 4))
    slow = cp_exchange_s(spec, 1, Cut(cp=4), (1e9, lat), core)[0]
    assert slow == pytest.approx(3 * (block / 1e9 + lat - core / 4))
    gathered = cp_exchange_s(spec, 1, Cut(cp=4, cp_comm="allgather"), (bw, lat), core)
    assert gathered[0] == pytest.approx(3 / 4 * 4 * block / bw + 2 * lat)
    assert gathered[1] == pytest.approx(2 * gathered[0])


def _megatron_options() -> set[str]:
    return set(json.loads(FIXTURE.read_text())["arguments"])


@pytest.mark.parametrize("argv, expected", [
    (["--model", "zoo:mixtral-8x7b?seq=4096", "--cluster", "dgx-h100x2", "--global-batch", "64", "-O", "ep=8",
      "-O", "tp=2", "-O", "etp=1"],
     ["--expert-model-parallel-size 8", "--expert-tensor-parallel-size 1", "--num-experts 8", "--moe-router-topk 2",
      "--moe-ffn-hidden-size 14336", "--moe-grouped-gemm", "--tensor-model-parallel-size 2"]),
    (["--model", "zoo:llama3-8b?seq=32768", "--cluster", "dgx-h100x2", "--global-batch", "16", "-O", "cp=4"],
     ["--context-parallel-size 4", "--cp-comm-type p2p", "--seq-length 32768"]),
])
def test_the_megatron_arguments_of_cp_and_ep_plans_are_megatrons_options(argv, expected, tmp_path, capsys):
    """The plan honors the pins; every option of its arguments is one Megatron-LM's parser
    registers, with the degrees of the plan."""
    out = tmp_path / "plan.json"
    assert main(["plan", *argv, "--planner", "megatron", "--out", str(out)]) == 0
    assert main(["export-plan", str(out), "--to", "megatron"]) == 0
    text = capsys.readouterr().out
    words = shlex.split(" ".join(ln for ln in text.splitlines() if not ln.startswith("#")))
    options = _megatron_options()
    assert {w for w in words if w.startswith("--")} <= options
    for item in expected:
        assert item in text, item
    par = json.loads(out.read_text())["parallelism"]
    assert par["tp"] * par["cp"] * par["pp"] * par["dp"] == 16


def test_deepseek_v3s_dense_first_layers_are_said_to_megatron():
    """``--moe-layer-freq`` as Megatron evaluates it: 3 dense layers, then 58 of experts."""
    from pipeplan.engines.megatron import expert_arguments

    args = expert_arguments(PRESETS["deepseek-v3"])
    freq = next(a for a in args if a.startswith("--moe-layer-freq"))
    assert eval(shlex.split(freq)[1]) == [0] * 3 + [1] * 58  # noqa: S307 (Megatron's own parse)
    assert "--moe-shared-expert-intermediate-size 2048" in args and "--num-experts 256" in args


@pytest.mark.parametrize("argv, words", [
    (["--model", "zoo:llama3-8b", "-O", "ep=2"], "has no experts"),
    (["--model", "zoo:llama3-8b?seq=4104", "-O", "cp=8"], "CP 8"),
    (["--model", "zoo:mixtral-8x7b?seq=4096", "-O", "ep=3"], "ep=3"),
    (["--model", "zoo:mixtral-8x7b?seq=4096", "-O", "tp=2", "-O", "sp=false"], "sequence parallelism"),
])
def test_a_pin_no_configuration_can_hold_is_refused_in_one_line(argv, words, capsys):
    assert main(["plan", *argv, "--cluster", "dgx-h100x2", "--global-batch", "16", "--planner", "megatron"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_zero1_saves_a_hand_count_of_a_mixtures_optimizer_state():
    """Mixtral 8x7B (4,096 tokens) at TP 2 x DP 8, EP 4 on 16 H100s: ZeRO-1 shards the dense
    weights' fp32 master and moments (6 bytes a 16-bit byte) over DP x CP = 8 and the experts'
    over the expert data-parallel 2 x 8 / 4 = 4; a rank's dense weights: 32 layers of
    (attention 41,943,040 + norms 8,192) / 2 + the router 32,768, the embedding and the head
    (32,000 x 4,096, its norm) over TP; its experts 32 x 2 x 3 x 4,096 x 14,336."""
    from pipeplan.cluster import load_cluster
    from pipeplan.graph.llm import build_graph
    from pipeplan.llm.layout import candidates
    from pipeplan.llm.parallelism import Parallelism
    from pipeplan.planners import llm3d
    from pipeplan.sim import simulate

    graph, cluster = build_graph(MIXTRAL, 1), load_cluster("dgx-h100x2")
    peak = []
    for zero in (0, 1):
        par = Parallelism(2, 1, 8, candidates(32, 1)[0], ep=4, microbatch=1, sp=True, zero=zero, recompute="full")
        peak.append(float(simulate(llm3d.plan_of(graph, cluster, par, 16), timeline=False).memory_bytes.max()))
    dense = 32 * ((41_943_040 + 8_192) / 2 + 32_768) + 32_000 * 4_096 / 2 + (4_096 + 32_000 * 4_096) / 2
    expert = 32 * 2 * 3 * 4_096 * 14_336
    assert peak[0] - peak[1] == pytest.approx(2 * 6 * (dense * (1 - 1 / 8) + expert * (1 - 1 / 4)), rel=1e-9)


def test_a_stages_expert_group_is_megatrons_expert_grid():
    """On 16 GPUs at TP 2, EP 8, ETP 1 the first EP group is GPUs 0-7 (one server); at ETP 2,
    GPUs 0, 2, ..., 14 (two servers); CP's ring the TP-th GPUs."""
    from pipeplan.cluster import load_cluster
    from pipeplan.cluster.collectives import exchange_links, group_links
    from pipeplan.sim.tensor_groups import stage_links

    cl, spec = load_cluster("dgx-h100x2"), PRESETS["mixtral-8x7b"]
    devs = list(range(16))
    links = stage_links(cl, devs, Cut(tp=2, sp=True, experts=ExpertCut(ep=8)), spec)
    assert links.ep == exchange_links(cl, range(8)) and links.tp == group_links(cl, [0, 1])
    links = stage_links(cl, devs, Cut(tp=2, sp=True, cp=2, experts=ExpertCut(ep=8, etp=2)), spec)
    assert links.ep == exchange_links(cl, range(0, 16, 2)) and links.etp == group_links(cl, [0, 1])
    assert links.cp == group_links(cl, [0, 2]) and links.ep != exchange_links(cl, range(8))


def test_a_v_schedule_places_chunk_j_and_2p_minus_1_minus_j_on_position_j():
    """ZB-V and DualPipeV hold two chunks a GPU in a V (Qi et al. ICLR'24 §6; torch's
    ``style="v"``: stages r and 2p-1-r on rank r): the embedding's chunk and the head's on the
    first position, whose GPUs then need no tied-embedding reduction; vpp must be 2."""
    from pipeplan.cluster import load_cluster
    from pipeplan.graph.llm import build_graph
    from pipeplan.llm.layout import v_candidates
    from pipeplan.llm.parallelism import Parallelism
    from pipeplan.planners import llm3d
    from pipeplan.sim import simulate
    from pipeplan.sim.durations import STAGE_STEP_EXTRA_S
    from pipeplan.sim.tensor_groups import lower

    layout = v_candidates(32, 4)[0]
    assert layout == (4,) * 8
    for sched in ("zb-v", "dualpipe-v"):
        par = Parallelism(2, 4, 2, layout, 2, microbatch=1, sp=True, schedule=sched)
        assert [par.position(j) for j in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0] and par.stage_layers() == [8] * 4
        plan = llm3d.plan_of(build_graph(replace(PRESETS["llama3-8b"], seq=1024, tied=True), 1),
                             load_cluster("dgx-h100x2"), par, 16)
        assert [s.devices[0] for s in plan.stages] == [f"s{(min(j, 7 - j) * 4) // 8}g{(min(j, 7 - j) * 4) % 8}"
                                                       for j in range(8)]
        low = lower(plan).plan.graph  # embedding and head together: no copy of the table, no reduction
        assert low.params[low.index["head"]] == plan.graph.params[plan.graph.index["head"]]
        assert not any(low.meta[STAGE_STEP_EXTRA_S])
        assert simulate(plan, timeline=False).iteration_s > 0
    with pytest.raises(Exception, match="two chunks a GPU in a V"):
        Parallelism(2, 4, 2, (2,) * 16, 4, schedule="zb-v")


def test_the_planner_considers_a_v_schedule_when_asked_and_never_otherwise(capsys):
    """``--schedule zb-v``: the plan is a V of two chunks; without it no V schedule is searched
    (their overlap is not priced yet, docs/llm.md)."""
    argv = ["plan", "--model", "zoo:llama3-8b?seq=1024", "--cluster", "dgx-h100x2", "--global-batch", "32",
            "--planner", "megatron", "--json"]
    assert main([*argv, "--schedule", "zb-v"]) == 0
    par = json.loads(capsys.readouterr().out)["parallelism"]
    assert par["schedule"] == "zb-v" and par["vpp"] == 2
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["parallelism"]["schedule"] not in ("zb-v", "dualpipe-v")


@pytest.fixture(scope="module")
def llm_plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["plan", "--model", "zoo:llama3-8b?seq=1024", "--cluster", "dgx-h100x2", "--global-batch", "16",
                 "--planner", "megatron", "--out", str(path)]) == 0
    return path


@pytest.mark.parametrize("change, words", [
    ({"precision": "fp16"}, "precision must be one of bf16, fp8"), ({"cp_comm": 5}, "cp_comm must be a string"),
    ({"cp_comm": "ring"}, "cp_comm must be one of"), ({"expert_skew": "x"}, "expert_skew must be a number"),
    ({"expert_skew": 0.5}, "expert_skew must be a number"), ({"etp": 0}, "etp must be an integer >= 1"),
    ({"cp": 3}, "CP 3"), ({"ep": 2}, "has no experts"), ({"bogus": 1}, "unknown key 'bogus'"),
])
def test_a_plan_files_5d_fields_are_checked_in_one_line(change, words, llm_plan_file, tmp_path, capsys):
    """The new fields of a plan file's parallelism, hostile: one line, exit 2."""
    doc = json.loads(llm_plan_file.read_text())
    doc["parallelism"].update(change)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["simulate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_fp8_weight_copies_are_a_hand_count_and_fp8_parameters_drop_them():
    """Llama 3 8B (1,024 tokens) at TP 2 x DP 8 in FP8 on 16 H100s: Transformer Engine keeps an
    FP8 copy of each linear weight and its transpose, 2 bytes a parameter of a rank's
    (4,096 x (4,096 + 2 x 1,024) + 4,096 x 4,096 + 3 x 4,096 x 14,336) / 2 a layer, 32 layers;
    with FP8 parameters (--fp8-param-gather) none; bf16 none. FP8 keeps each linear's input as
    its FP8 copy (Transformer Engine's ``_Linear``): a byte less an element of the QKV and first
    MLP inputs (whole under SP: 1,024 x 4,096 each, over TP 2), of the output projection's
    input (1,024 x 4,096) and the second MLP matrix's (1,024 x 14,336), over TP, 32 layers of one
    microbatch in flight."""
    from pipeplan.cluster import load_cluster
    from pipeplan.graph.llm import build_graph
    from pipeplan.llm.layout import candidates
    from pipeplan.llm.parallelism import Parallelism
    from pipeplan.planners import llm3d
    from pipeplan.sim import simulate

    graph, cluster = build_graph(replace(PRESETS["llama3-8b"], seq=1024), 1), load_cluster("dgx-h100x2")
    peak = {}
    for name, extra in (("bf16", {}), ("fp8", {"precision": "fp8"}),
                        ("fp8-params", {"precision": "fp8", "fp8_params": True})):
        par = Parallelism(2, 1, 8, candidates(32, 1)[0], microbatch=1, sp=True, zero=1, **extra)
        peak[name] = float(simulate(llm3d.plan_of(graph, cluster, par, 16), timeline=False).memory_bytes.max())
    linear = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336) / 2
    assert peak["fp8"] - peak["fp8-params"] == pytest.approx(2 * linear, rel=1e-9)
    kept = 32 * (2 * 1024 * 4096 / 2 + (1024 * 4096 + 1024 * 14336) / 2)
    assert peak["bf16"] - peak["fp8-params"] == pytest.approx(kept, rel=1e-9)


def test_a_passes_dispatch_and_combine_are_two_all_to_alls_of_the_ranks_copies():
    """Mixtral at 4,096 tokens, TP 2: a rank routes 2,048 tokens, 2 copies each, 4,096 x 2 bytes
    wide: each all-to-all over EP 4 sends 3 / 4 of 4,096 x 4,096 x 2 bytes in 3 latency steps;
    with ETP 2 the copies are also all-gathered and reduce-scattered over 2 ranks (half of the
    gathered 2 x 4,096 x 4,096 x 2 bytes each)."""
    from pipeplan.llm.experts import dispatch_s

    n, bw, lat = 2048 * 2, 100e9, 3e-6
    nbytes = n * 4096 * 2
    a2a = 3 / 4 * nbytes / bw + 3 * lat
    assert dispatch_s(MIXTRAL, n, ExpertCut(ep=4), (bw, lat), (0.0, 0.0)) == pytest.approx(2 * a2a)
    gathered = 1 / 2 * 2 * nbytes / 50e9 + 1 * 2e-6
    assert dispatch_s(MIXTRAL, n, ExpertCut(ep=4, etp=2), (bw, lat), (50e9, 2e-6)) == pytest.approx(
        2 * a2a + 2 * gathered)


@pytest.mark.parametrize("copies", [4096, 16])
def test_a_ranks_experts_cost_their_gemms_or_their_weights_whichever_is_longer(copies):
    """Mixtral's experts on an H100 at EP 4 (2 experts a rank), forward: each expert's GEMMs
    (2 x its copies x 3 x 4,096 x 14,336 FLOPs at 70.8% of 989 TFLOP/s) or its weights read
    (3 x 4,096 x 14,336 x 2 bytes at 3,350 GB/s), whichever is longer, a launch a matrix (17
    us), the SwiGLU's bytes (3 x 2 x 14,336 a copy) and the permutations (2 x 2 x 2 x 4,096 a
    copy): 4,096 copies are GEMM-bound, 16 weight-bound."""
    from pipeplan.llm.costs import Rates
    from pipeplan.llm.experts import experts_compute_s

    rates = Rates(989e12, 0.708, 17e-6, 3350e9)
    per = copies / 2
    gemm, weights = 2 * per * 3 * 4096 * 14336 / (989e12 * 0.708), 3 * 4096 * 14336 * 2 / 3350e9
    assert (gemm > weights) == (copies == 4096)
    bytes_ = copies * (3 * 2 * 14336 + 2 * 2 * 2 * 4096)
    fwd, bwd = experts_compute_s(MIXTRAL, rates, copies, ExpertCut(ep=4))
    assert fwd == pytest.approx(2 * max(gemm, weights) + 3 * 17e-6 + bytes_ / 3350e9)
    assert bwd == pytest.approx(2 * max(2 * gemm, 2 * weights) + 6 * 17e-6
                                + copies * (5 * 2 * 14336 + 2 * 2 * 2 * 4096) / 3350e9)


def test_deepseek_v3s_node_limited_routing_and_deepep_are_said_to_megatron():
    """Group-limited routing (``n_group`` 8, ``topk_group`` 4 in DeepSeek-V3's config) as
    ``--moe-router-num-groups``/``--moe-router-group-topk``; the DeepEP dispatcher as
    Megatron-core 0.16 names it (the flex dispatcher with its deepep backend); every option
    one of Megatron's (its parser's fixture)."""
    from pipeplan.engines.megatron import DISPATCHER_ARGUMENTS, expert_arguments

    fixture = json.loads((Path(__file__).parent / "fixtures" / "megatron_arguments.json").read_text())
    args = expert_arguments(PRESETS["deepseek-v3"])
    assert "--moe-router-num-groups 8" in args and "--moe-router-group-topk 4" in args
    assert DISPATCHER_ARGUMENTS["deepep"] == ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"]
    said = args + [a for v in DISPATCHER_ARGUMENTS.values() for a in v]
    assert {a.split()[0] for a in said} <= set(fixture["arguments"])


@pytest.mark.parametrize("fields, words", [({"route_groups": 8}, "needs experts, route_groups and route_group_topk"),
                                           ({"route_groups": 7, "route_group_topk": 4}, "must divide experts"),
                                           ({"route_groups": 8, "route_group_topk": 3}, "divide top_k")])
def test_group_limited_routing_is_checked_as_megatron_core_does(fields, words):
    from pipeplan.errors import PipeplanError

    with pytest.raises(PipeplanError, match=words):
        replace(PRESETS["deepseek-v3"], **fields) if "route_group_topk" in fields else \
            replace(PRESETS["deepseek-v3"], route_group_topk=0, **fields)


def test_a_dense_model_refuses_the_deepep_dispatcher_in_one_line(capsys):
    assert main(["plan", "--model", "zoo:llama3-8b", "--cluster", "dgx-h100x2", "--global-batch", "16",
                 "--planner", "megatron", "-O", "dispatcher=deepep"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no experts" in err, err


def test_a_mixtures_experts_keep_their_matrices_inputs_in_fp8():
    """Mixtral 8x7B, one 4,096-token sequence on one rank: 8,192 copies, each keeping its input
    (4,096) and the activation's output (14,336) as FP8 bytes and the gate and up outputs
    (2 x 14,336) in bf16; the router's fp32 scores, 8 a token. bf16: 2 bytes each."""
    spec = PRESETS["mixtral-8x7b"]
    router = 4 * 4096 * 8
    assert experts_activation_bytes(spec, 1, 1, 1, ExpertCut(), "none", fp8=True) == \
        8192 * (4096 + 14336 + 2 * 2 * 14336) + router
    assert experts_activation_bytes(spec, 1, 1, 1, ExpertCut(), "none") == 8192 * 2 * (4096 + 3 * 14336) + router


def test_dualpipe_v_is_among_the_schedules_searched_for_a_mixture_only():
    """The search considers DualPipeV unasked for a mixture of experts (its pairs hide the
    all-to-alls), never for a dense model; Megatron's rule of thumb keeps to Megatron's."""
    from pipeplan.cluster import load_cluster
    from pipeplan.planners import llm3d

    cluster = load_cluster("dgx-h100x2")
    mixture = llm3d.configs(PRESETS["mixtral-8x7b"], cluster, 32, llm3d.Pins())
    dense = llm3d.configs(replace(PRESETS["llama3-8b"], seq=1024), cluster, 32, llm3d.Pins())
    assert any(c.schedule == "dualpipe-v" for c in mixture) and not any(c.v_shape for c in dense)
    thumb = llm3d.rule_of_thumb(PRESETS["mixtral-8x7b"], cluster, 32, llm3d.Pins(), "adam")
    assert not thumb.v_shape


@pytest.mark.parametrize("global_batch, nearest", [(24, "(TP 1 x PP 2 x DP 8, even layers, 1f1b)"),
                                                   (32, "(TP 1 x PP 2 x DP 8, 2 chunks, even layers, interleaved-1f1b)")])
def test_megatron_names_the_nearest_plan_of_a_dualpipe_v_plan(global_batch, nearest):
    """Megatron runs no V; its nearest plan interleaves two chunks where a replica's
    microbatches are a multiple of PP (4 of them), else runs 1F1B (3: interleaving cannot)."""
    from pipeplan.cluster import load_cluster
    from pipeplan.engines import megatron
    from pipeplan.errors import PipeplanError
    from pipeplan.graph.llm import build_graph
    from pipeplan.llm.layout import v_candidates
    from pipeplan.llm.parallelism import Parallelism
    from pipeplan.planners import llm3d

    graph, cluster = build_graph(MIXTRAL, 1), load_cluster("dgx-h100x2")
    par = Parallelism(1, 2, 8, v_candidates(32, 2)[0], 2, ep=8, microbatch=1, recompute="full", zero=1,
                      schedule="dualpipe-v")
    with pytest.raises(PipeplanError, match="the nearest plan it can run") as e:
        megatron.parallel_arguments(llm3d.plan_of(graph, cluster, par, global_batch))
    assert nearest in str(e.value)
