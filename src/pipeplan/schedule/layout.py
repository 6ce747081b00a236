"""Which stages each device holds, as a schedule needs it (checked before any order is made).

- ``single``: one stage per device (every schedule but the chunked ones).
- ``loop``: model chunks in a loop (Narayanan et al. SC'21 §2.2): with p device groups and
  S = v x p stages, group d holds stages d, d + p, ..., d + (v-1) p, v >= 2.
- ``v``: a V (Qi et al., ICLR'24 §6, ZB-V): S = 2p stages, group d holds stages d and 2p-1-d.

A *group* is a stage's device list; stages that share a device have the same list
(``plan.validate``). Groups are numbered by pipeline position: the order of the stages
that first use them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PipeplanError

PLACEMENTS = ("single", "loop", "v")


@dataclass(frozen=True)
class Layout:
    """``groups[d]``: the devices at pipeline position d; ``stages[d]``: the stages they hold,
    in chunk order (chunk c of position d is ``stages[d][c]``)."""

    groups: tuple[tuple[int, ...], ...]
    stages: tuple[tuple[int, ...], ...]

    @property
    def depth(self) -> int:
        return len(self.groups)

    @property
    def chunks(self) -> int:
        return len(self.stages[0])


def _positions(stage_devices: tuple[tuple[int, ...], ...]) -> list[tuple[int, ...]]:
    groups: list[tuple[int, ...]] = []
    for g in stage_devices:
        if g not in groups:
            groups.append(g)
    return groups


def positions(stage_devices: list[list[int]]) -> Layout:
    """Any plan's device groups in pipeline order and the stages each holds (unchecked)."""
    groups = _positions(tuple(tuple(g) for g in stage_devices))
    return Layout(tuple(groups), tuple(tuple(j for j, g in enumerate(stage_devices) if tuple(g) == grp)
                                       for grp in groups))


def placement_positions(placement: str, s_count: int, p: int) -> list[int]:
    """The position (device group) of each of ``s_count`` stages under ``placement`` with p
    positions: stage j on j mod p (one stage each, or chunks in a loop), or a V (j, then
    2p-1-j)."""
    if placement == "v":
        return [min(j, 2 * p - 1 - j) for j in range(s_count)]
    return [j % p for j in range(s_count)]


def _refuse(name: str, placement: str, s_count: int, p: int) -> None:
    """One line on a plan whose shape the chunked ``placement`` cannot run."""
    if p == s_count:
        raise PipeplanError(f"schedule {name} needs several stages per device (model chunks) and this plan has "
                            "one stage per device group (plan it with --planner megatron --schedule "
                            f"{name}, or use 1f1b or zb-h1)")
    if placement == "loop" and s_count % p:
        raise PipeplanError(f"schedule {name}: {s_count} stages on {p} device groups; interleaving needs a "
                            "multiple of the groups (stage j on the devices of stage j mod p)")
    if placement == "v" and s_count != 2 * p:
        raise PipeplanError(f"schedule {name}: {s_count} stages on {p} device groups; a V needs exactly two "
                            "stages per group (2p stages)")


def layout(name: str, stage_devices: tuple[tuple[int, ...], ...], placement: str,
           replicas: str) -> Layout:
    """The plan's layout, or a one-line PipeplanError when ``placement`` cannot run it."""
    groups = _positions(stage_devices)
    s_count, p = len(stage_devices), len(groups)
    if placement == "single":
        if p != s_count:
            shared = next(j for j, g in enumerate(stage_devices) if stage_devices.index(g) != j)
            raise PipeplanError(f"schedule {name} runs one stage per device; this plan puts stages "
                                f"{stage_devices.index(stage_devices[shared])} and {shared} on the same devices "
                                "(model chunks run under interleaved-1f1b, zb-v or dualpipe-v)")
        return Layout(tuple(groups), tuple((s,) for s in range(s_count)))
    _refuse(name, placement, s_count, p)
    pos = placement_positions(placement, s_count, p)
    for j, g in enumerate(stage_devices):
        if g != groups[pos[j]]:
            where = "j mod p" if placement == "loop" else "min(j, 2p-1-j)"
            raise PipeplanError(f"schedule {name}: stage {j} is not on the devices of stage {pos[j]} (with {p} "
                                f"device groups, stage j runs on the devices of stage {where})")
    if replicas == "round-robin" and len({len(g) for g in groups}) > 1:
        raise PipeplanError(f"schedule {name}: round-robin replicas need the same number of devices in every "
                            "group (identical pipelines)")
    return Layout(tuple(groups), tuple(tuple(j for j in range(s_count) if pos[j] == d) for d in range(p)))
