"""The runtime's training data: each pipeline's share of a microbatch."""

import torch

from pipeplan.runtime.data import global_batch, share, share_size


def test_split_shares_cover_each_microbatch_once_as_evenly_as_samples_allow():
    z, k = 8, 3
    assert [share_size(z, p, k, "split") for p in range(k)] == [3, 3, 2]
    rows = torch.cat([share(m, z, p, k, "split") for m in range(2) for p in range(k)])
    assert sorted(rows.tolist()) == list(range(2 * z))
    assert share(1, z, 0, k, "round-robin").tolist() == list(range(8, 16))


def test_token_ids_stay_token_ids():
    model = torch.nn.Sequential(torch.nn.Embedding(50, 4), torch.nn.Linear(4, 2))
    xs, ys = global_batch(model, torch.randint(0, 50, (4, 7)), 3, seed=0)
    assert xs.dtype == torch.int64 and xs.shape == (12, 7) and 0 <= int(xs.min()) and int(xs.max()) < 50
    assert ys.shape == (12, 7, 2)
