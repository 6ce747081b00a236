"""Sharding propagation over the tensor IR (auto-map.txt §3.2.1, §4.2).

Every tensor holds a *domain*: the set of placements (``rules``: R, P, S(d)) still possible
for it, a bit mask. A decision narrows a domain (a variable partitioned along d: {S(d)};
dimension d replicated: S(d) removed); propagation then keeps, for every op, only the
placement tuples of its rule that every domain allows, and narrows each of its tensors'
domains to what those tuples allow, until nothing changes (arc consistency). It ends as the
paper says in one of three ways: (1) not enough information (domains with several
placements remain), (2) a conflict (an op with no tuple left, or a tensor with no
placement), (3) everything decided (every domain a single placement).

A replicated input read by an op from a tensor that is a partial sum is the one data
movement allowed (an all-reduce): the rule's tuple with ``R`` at that input also appears
with ``P`` there, marked as an all-reduce.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import product

import numpy as np

from .program import BUFFER, INPUT, PARAM, TensorInfo, TensorProgram
from .rules import ANY, COMPONENTS, STRIDE, P, R, S, dim_of, name, strategies

Domains = list[int]
#: A parameter's cuts: plain (component 0) or strided by its first inner component
PARAM_COMPONENTS = 2
#: Ops that may read a cut input whole (all-gather) under the cost model's rules: those that
#: do the work a gather pays for (contractions, lookups, normalizations, the loss); plain cuts only.
GATHERING = {"mm", "addmm", "bmm", "convolution", "embedding", "gather", "_softmax", "_log_softmax",
             "native_layer_norm"}


def bit(code: int) -> int:
    return 1 << code


def codes(mask: int) -> list[int]:
    """The placement codes in a domain mask."""
    return [c for c in range(mask.bit_length()) if mask >> c & 1]


@dataclass(frozen=True)
class OpTable:
    """One op's admissible tuples as bit masks over its slots (inputs, then outputs)."""

    slots: tuple[int, ...]
    tuples: tuple[tuple[int, ...], ...]
    allreduce: tuple[int, ...]  # per tuple: bit i set = input i is a partial read whole (all-reduce)
    allgather: tuple[int, ...]  # per tuple: bit i set = input i is a cut read whole (all-gather)
    known: bool
    masks: np.ndarray = field(init=False, repr=False, compare=False)  # ``tuples`` as (tuples, slots) int64

    def __post_init__(self) -> None:
        masks = np.array(self.tuples, dtype=np.int64).reshape(len(self.tuples), len(self.slots))
        object.__setattr__(self, "masks", masks)  # masks hold 2 + STRIDE * COMPONENTS < 64 bits

    def alive_mask(self, dom: "Domains") -> np.ndarray:
        """Per tuple, whether every tensor's domain still allows it."""
        cur = np.array([dom[t] for t in self.slots], dtype=np.int64)
        return (self.masks & cur).all(axis=1)

    def alive(self, dom: "Domains") -> list[int]:
        """The tuples every tensor's domain still allows."""
        return np.flatnonzero(self.alive_mask(dom)).tolist()


def _expand(strategy: tuple[int, ...], n_inputs: int, partial: list[bool], cuts: list[list[int]],
            any_mask: int) -> list[tuple]:
    """The tuple as bit masks, and its variants reading whole an input the rule wants whole
    from a partial sum (all-reduce) or, where ``cuts`` lists them, from a cut (all-gather)."""
    options = []
    for i, code in enumerate(strategy):
        if code == ANY:
            options.append([(any_mask, 0, 0)])
        elif code == R and i < n_inputs:
            opts = [(bit(R), 0, 0)] + ([(bit(P), 1 << i, 0)] if partial[i] else [])
            options.append(opts + [(bit(c), 0, 1 << i) for c in cuts[i]])
        else:
            options.append([(bit(code), 0, 0)])
    return [(tuple(m for m, _, _ in combo), sum(a for _, a, _ in combo), sum(g for _, _, g in combo))
            for combo in product(*options)]


class Propagator:
    """The rule tables of a program on ``devices`` devices, and propagation over domains."""

    def __init__(self, prog: TensorProgram, devices: int, inputs_splittable: bool = False,
                 gathers: bool = False) -> None:
        self.prog, self.devices = prog, devices
        self.inputs_splittable, self.gathers = inputs_splittable, gathers
        self.ops_of: list[list[int]] = [[] for _ in prog.tensors]
        self.tables: list[OpTable] = [self._table(op) for op in prog.ops]
        for o, table in enumerate(self.tables):
            for t in dict.fromkeys(table.slots):
                self.ops_of[t].append(o)
        self.unknown = sorted({op.target for op, tb in zip(prog.ops, self.tables) if not tb.known})

    def _table(self, op) -> OpTable:
        strategies_, known = strategies(op, self.prog, self.devices)
        slots = op.inputs + op.outputs
        partial = [self.prog.tensors[t].dtype != "bool" for t in op.inputs]
        gathers = self.gathers and op.target in GATHERING
        cuts = [[c for c in codes(self.initial_domain(self.prog.tensors[t])) if 2 <= c < 2 + STRIDE] if gathers
                else [] for t in op.inputs]
        any_mask = (1 << (2 + STRIDE * COMPONENTS)) - 1
        seen: dict[tuple, tuple[int, int]] = {}
        for s in strategies_:
            for masks, ar, ag in _expand(s, len(op.inputs), partial, cuts, any_mask):
                if self._consistent(slots, masks) and masks not in seen:
                    seen[masks] = (ar, ag)
        flags = list(seen.values())
        return OpTable(slots, tuple(seen), tuple(f[0] for f in flags), tuple(f[1] for f in flags), known)

    @staticmethod
    def _consistent(slots: tuple[int, ...], masks: tuple[int, ...]) -> bool:
        """A tensor in two slots of one op must hold one placement in both."""
        first: dict[int, int] = {}
        for t, m in zip(slots, masks):
            if t in first and not first[t] & m:
                return False
            first[t] = first.get(t, m) & m
        return True

    def initial_domain(self, t: TensorInfo) -> int:
        """Every placement a tensor of its kind and shape may take: cut only along dimensions of
        at least ``devices`` (uneven cuts allowed; a reshape passes only even ones on, rules.view);
        partial sums only for computed values (not booleans); strided cuts for computed values
        and, of their first inner component, for parameters (a fused weight cut block by block)."""
        mask = bit(R)
        splittable = t.kind in (PARAM, BUFFER, "value") or (t.kind == INPUT and self.inputs_splittable)
        components = PARAM_COMPONENTS if t.kind == PARAM else COMPONENTS if t.kind == "value" else 1
        if splittable:
            for d, size in enumerate(t.shape):
                if size >= self.devices:
                    mask |= sum(bit(S(d, k)) for k in range(components))
        if t.kind == "value" and t.dtype != "bool":  # a partial count is a partial sum too
            mask |= bit(P)
        return mask

    def start(self) -> tuple[Domains, int | None]:
        """The domains before any decision, propagated, parameters' strided cuts kept only where
        their plain cut is gone (a conflict here: the model cannot run even replicated, which
        means a rule is wrong)."""
        dom = [self.initial_domain(t) for t in self.prog.tensors]
        conflict = self.propagate(dom, range(len(self.prog.tensors)))
        if conflict is not None:
            return dom, conflict
        return self.narrow(dom, self._plain_over_strided(dom))

    def _plain_over_strided(self, dom: Domains) -> dict[int, int]:
        """Masks dropping a parameter's strided cuts of every dimension it can still cut plainly:
        a strided cut is kept for a fused weight, whose plain cut cannot run (GPT-2's c_attn)."""
        drop: dict[int, int] = {}
        for t in self.prog.of_kind(PARAM):
            strided = sum(bit(S(d, k)) for d in range(t.rank) if dom[t.id] & bit(S(d))
                          for k in range(1, PARAM_COMPONENTS))
            if strided:
                drop[t.id] = ~strided
        return drop

    def narrow(self, dom: Domains, changes: dict[int, int]) -> tuple[Domains, int | None]:
        """A copy of ``dom`` with each tensor's domain ANDed with its mask, propagated;
        returns it and the op (or -1 - tensor) of a conflict, None when there is none."""
        dom = list(dom)
        touched = []
        for t, mask in changes.items():
            new = dom[t] & mask
            if new == 0:
                return dom, -1 - t
            if new != dom[t]:
                dom[t] = new
                touched.append(t)
        return dom, self.propagate(dom, touched)

    def propagate(self, dom: Domains, touched) -> int | None:
        """Arc consistency from the tensors in ``touched``, in place."""
        queue: deque[int] = deque()
        queued: set[int] = set()
        for t in touched:
            for o in self.ops_of[t]:
                if o not in queued:
                    queued.add(o)
                    queue.append(o)
        while queue:
            o = queue.popleft()
            queued.discard(o)
            table = self.tables[o]
            alive = table.alive_mask(dom)
            if not alive.any():
                return o
            allowed = np.bitwise_or.reduce(table.masks[alive], axis=0).tolist()
            for s, t in enumerate(table.slots):
                new = dom[t] & allowed[s]
                if new != dom[t]:
                    if new == 0:
                        return o
                    dom[t] = new
                    for u in self.ops_of[t]:
                        if u != o and u not in queued:
                            queued.add(u)
                            queue.append(u)
        return None

    def describe_conflict(self, where: int) -> str:
        """One line naming the op (or tensor) where propagation found no placement."""
        if where < 0:
            t = self.prog.tensors[-1 - where]
            return f"tensor {t.source or t.name} has no placement left"
        op = self.prog.ops[where]
        names = [self.prog.tensors[t].source or self.prog.tensors[t].name for t in op.inputs]
        return f"{op.target}({', '.join(names)}) in {op.module or 'the model'} has no rule for its inputs' placements"


def dim_cuts(d: int) -> int:
    """The mask of every cut of dimension d, plain or strided."""
    return sum(bit(S(d, k)) for k in range(COMPONENTS))


def cut_dim(mask: int) -> int | None:
    """The partitioned dimension of a decided domain; None when replicated, partial or undecided."""
    cs = codes(mask)
    return dim_of(cs[0])[0] if len(cs) == 1 and cs[0] >= 2 else None


def is_strided(mask: int) -> bool:
    """Whether a decided domain is a strided cut (of an inner component of its dimension)."""
    cs = codes(mask)
    return len(cs) == 1 and cs[0] >= 2 and dim_of(cs[0])[1] > 0


def placement_name(mask: int) -> str:
    """``R``, ``P``, ``S(1)``, or a set ``{R,S(0)}`` for an undecided domain."""
    names = [name(c) for c in codes(mask)]
    return names[0] if len(names) == 1 else "{" + ",".join(names) + "}"
