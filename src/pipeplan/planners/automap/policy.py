"""The trained Auto-MAP agent as planning needs it (``infer.beam``): Q-values of a batch of
observations and the discount its shaping used. Planning runs the Q-network in numpy, so a
planning command imports neither torch nor gymnasium: the network is ``learn.dqn.PointwiseQ``
(a trunk of ReLU layers applied to every action's row with the globals, a dueling head), its
forward written here with the same operations; its weights come from the checkpoint's numpy
twin, ``NAME.npz`` beside ``NAME.pt`` (the shipped one, and every one ``pipeplan train
automap-infer`` writes), which records the SHA-256 of the checkpoint it was made from and is
used only for those bytes; else from the ``.pt`` through torch.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ...errors import PipeplanError

#: the npz's arrays beside the weights
GAMMA, HIDDEN, SOURCE = "__gamma__", "__hidden__", "__source_sha256__"


@dataclass(frozen=True)
class Policy:
    """``q(obs)``: (batch, actions) Q-values of (batch, obs) observations; ``gamma``: the
    discount the agent's rewards were shaped with."""

    q: Callable[[np.ndarray], np.ndarray]
    gamma: float


class NumpyQ:
    """``PointwiseQ.forward`` in numpy, float32: rows = obs[:, :A*F] as (A, F) per observation,
    each row with the globals through the trunk (Linear, ReLU)*, then V(mean of the rows'
    hidden states) + A - mean(A)."""

    def __init__(self, state: dict[str, np.ndarray], actions: int, features: int) -> None:
        self.actions, self.features = actions, features
        count = sum(1 for k in state if k.startswith("trunk.") and k.endswith(".weight"))
        self.trunk = [(state[f"trunk.{2 * i}.weight"].T.astype(np.float32), state[f"trunk.{2 * i}.bias"].astype(np.float32))
                      for i in range(count)]
        self.adv = (state["advantage.weight"].T.astype(np.float32), state["advantage.bias"].astype(np.float32))
        self.val = (state["value.weight"].T.astype(np.float32), state["value.bias"].astype(np.float32))

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs, dtype=np.float32)
        n, split = len(obs), self.actions * self.features
        rows = obs[:, :split].reshape(n, self.actions, self.features)
        glob = np.broadcast_to(obs[:, None, split:], (n, self.actions, obs.shape[1] - split))
        z = np.concatenate([rows, glob], axis=2).reshape(n * self.actions, -1)  # one 2-D GEMM a layer:
        for w, b in self.trunk:  # numpy's batched 3-D matmul is 30x slower here
            z = np.maximum(z @ w + b, 0.0)
        a = (z @ self.adv[0] + self.adv[1])[:, 0].reshape(n, self.actions)
        v = z.reshape(n, self.actions, -1).mean(axis=1) @ self.val[0] + self.val[1]
        return v + a - a.mean(axis=-1, keepdims=True)


def twin(path: Path) -> Path:
    """The numpy twin of checkpoint ``path``."""
    return path.with_suffix(".npz")


def twin_bytes(checkpoint: dict, source: bytes) -> bytes:
    """The numpy twin of ``checkpoint`` (whose file holds ``source``): its weights as stored
    (fp16), its discount and hidden widths, the SHA-256 of ``source``."""
    import io

    arrays = {k: v.numpy() for k, v in checkpoint["state"].items()}
    cfg = checkpoint["config"]
    buf = io.BytesIO()
    np.savez(buf, **arrays, **{GAMMA: np.float64(cfg["gamma"]), HIDDEN: np.asarray(cfg["hidden"], dtype=np.int64),
                               SOURCE: np.asarray(hashlib.sha256(source).hexdigest())})
    return buf.getvalue()


def load_twin(path: Path, actions: int, features: int, obs_dim: int) -> Policy | None:
    """The policy of checkpoint ``path``'s numpy twin, or None when it has none made from its
    present bytes; a twin of the right checkpoint whose weights are not the network the
    planner feeds is one line."""
    where = f"checkpoint {str(twin(path))!r}"
    if not twin(path).is_file():
        return None
    try:
        with np.load(twin(path), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise PipeplanError(f"{where}: not a numpy checkpoint ({type(e).__name__})") from None
    if str(arrays.pop(SOURCE, "")) != hashlib.sha256(path.read_bytes()).hexdigest():
        return None  # made from other bytes: the checkpoint was replaced since
    hidden = [int(h) for h in arrays.pop(HIDDEN, [])]
    gamma = float(arrays.pop(GAMMA, np.nan))
    expected = _shapes(obs_dim - actions * features + features, hidden)
    if set(arrays) != set(expected) or any(arrays[k].shape != s for k, s in expected.items()) \
            or not np.isfinite(gamma) or not all(np.isfinite(a).all() for a in arrays.values()):
        raise PipeplanError(f"{where}: its weights are not the planner's network")
    return Policy(NumpyQ(arrays, actions, features), gamma)


def _shapes(width: int, hidden: list[int]) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for i, h in enumerate(hidden):
        out[f"trunk.{2 * i}.weight"], out[f"trunk.{2 * i}.bias"] = (h, width), (h,)
        width = h
    out.update({"advantage.weight": (1, width), "advantage.bias": (1,), "value.weight": (1, width),
                "value.bias": (1,)})
    return out


def torch_policy(online: Any, gamma: float) -> Policy:
    """A policy of a torch Q-network (training's agent, a checkpoint without its twin)."""
    import torch

    def q(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return online(torch.as_tensor(np.asarray(obs, dtype=np.float32))).numpy()

    return Policy(q, gamma)
