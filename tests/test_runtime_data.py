"""The runtime's training data: each pipeline's share of a microbatch."""

import pytest
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


def test_check_scale_floor_absorbs_rounding_near_zero_but_not_a_lost_update():
    """compare_states: a tensor that stays near zero holds rounding noise (1e-9 on 1e-9), which
    must not fail the check; a parameter off by one update (1e-4 on 0.05) must."""
    import torch

    from pipeplan.runtime.check import SCALE_FLOOR, TOLERANCE, compare_states

    ref = {"key_bias": torch.full((4,), 1e-9), "w": torch.full((4,), 0.05)}
    noisy = {0: {"key_bias": torch.full((4,), 2e-9).numpy(), "w": torch.full((4,), 0.05).numpy()}}
    assert compare_states(noisy, ref)[0] <= 1e-9 / SCALE_FLOOR < TOLERANCE
    lost = {0: {"key_bias": torch.full((4,), 1e-9).numpy(), "w": torch.full((4,), 0.05 + 1e-4).numpy()}}
    worst, where = compare_states(lost, ref)
    assert where == "w" and worst == pytest.approx(1e-4 / 0.05, rel=1e-3)
