"""Small builders shared by the tests."""

from __future__ import annotations

from pipeplan.cluster import hierarchical
from pipeplan.graph import Graph
from pipeplan.plan import Plan, Stage


def uniform_chain(layers: int, f: float = 1.0, b: float = 2.0, params: float = 0.0, act: float = 0.0) -> Graph:
    return Graph.chain("uniform", [f] * layers, [b] * layers, params=[params] * layers, act=[act] * layers)


def one_server(v: int, bandwidth: float = 1e9):
    return hierarchical("test", 1, v, bandwidth, bandwidth)


def chain_plan(graph: Graph, cluster, cuts: list[int], replicas: list[int], m: int, schedule: str,
               mode: str = "split") -> Plan:
    """Stages [cuts[i], cuts[i+1]) of the chain; stage i on the next replicas[i] devices
    (``mode``: how replicas share microbatches)."""
    stages, d = [], 0
    for a, b, k in zip(cuts[:-1], cuts[1:], replicas):
        stages.append(Stage(graph.ids[a:b], cluster.names[d:d + k]))
        d += k
    return Plan(graph, cluster, stages, m, schedule=schedule, replicas=mode)


#: A small valid graph and cluster, as their files hold them (the hostile-input tests mutate them).
GRAPH_DICT = {"format": "pipeplan.graph/1", "name": "g", "meta": {"microbatch": 4},
              "nodes": [{"id": "a", "fwd_s": 0.001, "bwd_s": 0.002, "params_bytes": 4000, "act_bytes": 1000},
                        {"id": "b", "fwd_s": 0.001, "bwd_s": 0.002, "params_bytes": 4000, "act_bytes": 1000}],
              "edges": [["a", "b"]]}
CLUSTER_DICT = {"name": "c", "devices": [{"name": "d0", "kind": "V100"}, {"name": "d1", "kind": "V100"}],
                "bandwidth": "10GB/s", "latency": "10us"}


def process_alive(pid: int) -> bool:
    """Running (a zombie that nobody reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def default_sigint() -> None:
    """``preexec_fn`` of a child that a test sends Ctrl-C: SIGINT at its default, as a
    terminal's foreground command has it (a test run started in the background of a
    non-interactive shell ignores SIGINT, and children inherit that)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def layout_stages(names: list[str], layers: int, tp: int, pp: int, dp: int, vpp: int = 1,
                  counts: list[int] | None = None) -> list[Stage]:
    """A plan's stages in Megatron's layout (``llm.layout.stages``): ``counts`` layers a chunk,
    default the even split."""
    from pipeplan.llm.layout import even, stages
    from pipeplan.llm.parallelism import Parallelism

    par = Parallelism(tp, pp, dp, tuple(counts) if counts else even(layers, pp, vpp), vpp,
                      schedule="1f1b" if vpp == 1 else "interleaved-1f1b")
    return [Stage(*chunk) for chunk in stages(names, par)]
