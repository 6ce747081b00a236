"""The sizes pipeplan plans for, checked when an input is read, so that a mistyped number
fails at once with one line instead of exhausting memory or time minutes later."""

from __future__ import annotations


from .errors import PipeplanError

#: Devices in one cluster: the link matrices are devices^2 and the planners' searches grow
#: with them (a 4,096-GPU cluster is 128 MiB of links before any planning).
MAX_DEVICES = 4096
#: Devices in a cluster whose links are uniform per server (DGX presets, ``hier:`` specs): held
#: by server, not as dense matrices (``cluster.links``), planned by the 3D planners of decoder
#: LLMs (Llama 3 405B trained on 16,384 H100s).
MAX_SERVER_DEVICES = 65536
#: Layers (nodes) in one model graph.
MAX_LAYERS = 20000
#: The largest figures a model file may give one layer (one microbatch on the reference
#: device): about 11 days, an exabyte, 10^24 FLOPs. Larger ones are typos or junk, and would
#: overflow the simulator's sums.
LAYER_RANGES = {"s": 1e6, "bytes": 1e18, "FLOPs": 1e24}
#: Bytes in one input file (graph, cluster, plan): the largest profile is a few MiB.
MAX_FILE_BYTES = 2**30
#: Seconds one calibration measurement may take (``calibrate --seconds``).
MAX_CALIBRATION_S = 3600.0
#: Seeds: numpy's legacy generators and torch take at most 32 bits.
MAX_SEED = 2**32 - 1
#: the fastest device, relative to the reference device (a speed of 1): beyond it the
#: simulator's products of speeds and bytes leave floating point
MAX_SPEED = 1e6
#: the longest wall-clock budget (``--budget``, ``-O budget``): 30 days
MAX_BUDGET_S = 30 * 86400.0
#: Microbatches per iteration: the simulator's task graph is microbatches x stages x 4.
MAX_MICROBATCHES = 65536


def check_devices(count: int, where: str, by_server: bool = False) -> None:
    """At most ``MAX_DEVICES`` devices, or ``MAX_SERVER_DEVICES`` for a cluster whose links
    are uniform per server (``by_server``)."""
    most = MAX_SERVER_DEVICES if by_server else MAX_DEVICES
    if count > most:
        raise PipeplanError(f"{where}: {count:,} devices; pipeplan plans for at most {most:,}"
                            + ("" if by_server else f" with links given device by device ({MAX_SERVER_DEVICES:,} "
                               "with uniform links per server: a hier: spec or a dgx preset)"))


def check_layers(count: int, where: str) -> None:
    if count > MAX_LAYERS:
        raise PipeplanError(f"{where}: {count:,} layers; pipeplan plans for at most {MAX_LAYERS:,} "
                            "(merge layers into blocks: a stage boundary falls between blocks anyway)")


#: A decoder LLM's dimensions (``zoo:``, ``hf:``, plan files alike): above the largest models
#: and contexts trained (hidden 25,600 and 128K-10M tokens in 2025-26) with room to spare,
#: below what would make a plan's arithmetic meaningless or its graph take minutes to build.
MAX_DECODER = {"layers": MAX_LAYERS, "hidden": 1 << 18, "ffn": 1 << 20, "heads": 1 << 14, "kv_heads": 1 << 14,
               "seq": 1 << 24, "vocab": 1 << 22, "microbatch": 1 << 16, "head_size": 1 << 14, "experts": 1 << 14,
               "top_k": 1 << 14, "expert_ffn": 1 << 20, "shared_ffn": 1 << 20, "dense_layers": MAX_LAYERS,
               "route_groups": 1 << 14, "route_group_topk": 1 << 14,
               "q_lora": 1 << 18, "kv_lora": 1 << 18, "rope_dim": 1 << 14, "v_head": 1 << 14}


def check_decoder(key: str, value: int, where: str) -> None:
    """One line when a decoder dimension ``key`` is above ``MAX_DECODER``'s."""
    most = MAX_DECODER[key]
    if value > most:
        raise PipeplanError(f"{where}: {key} {value:,} is above pipeplan's limit of {most:,}")


def check_layer_value(value: float, unit: str, where: str) -> float:
    """``value`` when it lies in 0 .. ``LAYER_RANGES[unit]``; else PipeplanError."""
    bound = LAYER_RANGES[unit]
    if not 0 <= value <= bound:  # NaN fails too
        raise PipeplanError(f"{where}: {value:g} is out of range (0 to {bound:g} {unit})")
    return value


def check_microbatches(count: int, where: str) -> None:
    if count > MAX_MICROBATCHES:
        raise PipeplanError(f"{where}: {count:,} microbatches; at most {MAX_MICROBATCHES:,} "
                            "(use larger microbatches: --global-batch picks their size)")


#: Bytes of one example microbatch built on this machine (``--microbatch``, ``hf:...&microbatch=``):
#: a profile holds several activations of it at once.
MAX_EXAMPLE_INPUT_BYTES = 4 << 30
#: Parameters of a model built from a config with random weights (``hf:``): 4 GB in fp32
#: before gradients and optimizer state, and minutes of initialization beyond it.
MAX_BUILT_PARAMETERS = 1_000_000_000


def check_input_bytes(nbytes: float, where: str) -> None:
    if nbytes > MAX_EXAMPLE_INPUT_BYTES:
        raise PipeplanError(f"{where}: one microbatch of input is {nbytes:,.0f} bytes; at most "
                            f"{MAX_EXAMPLE_INPUT_BYTES:,} (a smaller microbatch or sequence)")


def check_built_parameters(count: float, where: str) -> None:
    if count > MAX_BUILT_PARAMETERS:
        raise PipeplanError(f"{where}: about {count:,.0f} parameters; pipeplan builds models of at most "
                            f"{MAX_BUILT_PARAMETERS:,} (fewer layers or a smaller width)")
