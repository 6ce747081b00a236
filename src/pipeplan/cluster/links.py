"""A link matrix held by servers: uniform inside each server and between any two servers, as
a DGX cluster or a ``hier:`` spec describes it, in O(devices) memory. A 16,384-GPU cluster's
dense bandwidth and latency matrices would take 4 GiB; this form answers the same indexing
(``links[i, j]``, ``links[np.ix_(a, b)]``, index arrays that broadcast) without them.

Clusters of more than ``limits.MAX_DEVICES`` devices are built this way; what needs the whole
matrix at once (``np.asarray(links)``) gets it only up to that size, else one line saying
which planners plan such clusters."""

from __future__ import annotations

import numpy as np

from ..errors import PipeplanError
from ..limits import MAX_DEVICES


class ServerLinks:
    """``server_of[v]``: device v's server; ``inside`` between two devices of a server,
    ``between`` across servers, ``own`` from a device to itself (inf bandwidth, 0 latency)."""

    ndim = 2
    dtype = np.dtype(float)

    def __init__(self, server_of: np.ndarray, inside: float, between: float, own: float) -> None:
        self.server_of = np.asarray(server_of, dtype=np.int64)
        self.inside, self.between, self.own = float(inside), float(between), float(own)
        self.shape = (self.server_of.size, self.server_of.size)

    def _index(self, k) -> np.ndarray:
        return np.arange(self.shape[0])[k] if isinstance(k, slice) else np.asarray(k, dtype=np.int64)

    def __getitem__(self, key) -> np.ndarray:
        if not isinstance(key, tuple) or len(key) != 2:
            raise PipeplanError(self._whole())
        a, b = (self._index(k) for k in key)
        same = self.server_of[a] == self.server_of[b]
        return np.where(a == b, self.own, np.where(same, self.inside, self.between))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        if self.shape[0] > MAX_DEVICES:
            raise PipeplanError(self._whole())
        n = np.arange(self.shape[0])
        out = self[n[:, None], n[None, :]]
        return out if dtype is None else out.astype(dtype)

    def _whole(self) -> str:
        return (f"this needs the cluster's links device by device, and a cluster of {self.shape[0]:,} devices "
                f"(over {MAX_DEVICES:,}) holds them by server: plan it with joint, megatron, dp, gpipe or hetpipe, "
                "or plan one data-parallel replica's share of it")

    def copy(self) -> "ServerLinks":
        return self  # read-only

    def off_diagonal(self) -> list[float]:
        """The values between distinct devices."""
        servers = np.unique(self.server_of)
        sizes = np.bincount(self.server_of)
        out = [self.inside] if sizes.max(initial=0) > 1 else []
        return out + ([self.between] if servers.size > 1 else [])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ServerLinks):
            return (np.array_equal(self.server_of, other.server_of)
                    and (self.inside, self.between, self.own) == (other.inside, other.between, other.own))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def as_dict(self) -> dict:
        return {"inside": self.inside, "between": self.between}
