"""Central, local and distributed DP mechanisms: clipping bounds and noise statistics."""

import numpy as np
import pytest

from sporenet.federated.aggregation import Aggregator
from sporenet.federated.errors import AggregationError
from sporenet.federated.privacy import (
    AdaptiveClipping,
    CentralDPAggregator,
    DistributedDP,
    LocalDP,
    PrivacyConfigError,
    clip_l2,
    l2_norm,
)
from sporenet.federated.privacy.clipping import update_noise_multiplier
from sporenet.federated.secagg import SecAggConfig, Stage
from sporenet.federated.secagg.simulation import DropoutPlan, run_round

TEMPLATE = {"w": ((50,), np.dtype(np.float32)), "b": ((3,), np.dtype(np.float32))}


def _update(rng, scale=1.0):
    return {
        "w": rng.normal(0, scale, 50).astype(np.float32),
        "b": rng.normal(0, scale, 3).astype(np.float32),
    }


def test_clip_l2_bounds_the_global_norm_and_keeps_small_updates() -> None:
    rng = np.random.default_rng(0)
    u = _update(rng, 10.0)
    clipped, norm = clip_l2(u, 1.0)
    assert norm > 1.0 and l2_norm(clipped) == pytest.approx(1.0)
    small = {k: v * 1e-3 for k, v in u.items()}
    kept, _ = clip_l2(small, 1.0)
    np.testing.assert_allclose(kept["w"], small["w"], rtol=1e-6)
    assert l2_norm(clip_l2(np.zeros(4), 1.0)[0]) == 0.0


def test_central_dp_without_noise_is_the_clipped_mean_and_an_aggregator() -> None:
    rng = np.random.default_rng(1)
    agg = CentralDPAggregator(TEMPLATE, noise_multiplier=0.0, clipping_norm=0.5, expected_clients=4)
    assert isinstance(agg, Aggregator)
    ups = [_update(rng, 1.0) for _ in range(4)]
    for i, u in enumerate(ups):
        agg.add(str(i), u, weight=100.0)
    want = sum(clip_l2(u, 0.5)[0]["w"] for u in ups) / 4
    np.testing.assert_allclose(agg.result()["w"], want, rtol=1e-5)
    with pytest.raises(AggregationError, match="already folded"):
        agg.add("0", ups[0], 1.0)


def test_central_dp_noise_has_the_promised_std_and_survives_a_snapshot() -> None:
    agg = CentralDPAggregator(
        {"w": ((200_000,), np.dtype(np.float64))},
        noise_multiplier=1.5,
        clipping_norm=2.0,
        expected_clients=10,
        rng=np.random.default_rng(2),
    )
    agg.add("a", {"w": np.zeros(200_000)}, 1.0)
    restored = CentralDPAggregator(
        {"w": ((200_000,), np.dtype(np.float64))},
        noise_multiplier=1.5,
        clipping_norm=2.0,
        expected_clients=10,
        rng=np.random.default_rng(2),
    )
    restored.restore(agg.snapshot())
    out = restored.result()["w"]
    # std of the mean = zC / expected = 0.3; 2e5 samples give ~0.16% standard error.
    assert out.std() == pytest.approx(0.3, rel=0.01) and abs(out.mean()) < 0.005
    assert restored.clients == ["a"]


def test_adaptive_clipping_tracks_the_target_quantile() -> None:
    rng = np.random.default_rng(3)
    clip = AdaptiveClipping(clipping_norm=0.01, target_quantile=0.5, learning_rate=0.3)
    for _ in range(200):
        norms = rng.lognormal(mean=0.0, sigma=0.5, size=100)  # median 1.0
        clip.update(norms, rng)
    assert clip.clipping_norm == pytest.approx(1.0, rel=0.2)
    assert AdaptiveClipping.from_dict(clip.to_dict()) == clip


def test_adaptive_central_dp_moves_its_norm_and_splits_the_noise() -> None:
    adaptive = AdaptiveClipping(
        clipping_norm=0.1, target_quantile=0.5, learning_rate=0.5, count_noise_multiplier=5.0
    )
    agg = CentralDPAggregator(
        TEMPLATE,
        noise_multiplier=1.0,
        adaptive=adaptive,
        expected_clients=8,
        rng=np.random.default_rng(4),
    )
    rng = np.random.default_rng(5)
    for i in range(8):
        agg.add(str(i), _update(rng, 1.0), 1.0)
    agg.result()
    assert adaptive.clipping_norm > 0.1  # every update was clipped: the norm grows
    assert update_noise_multiplier(1.0, 5.0) == pytest.approx((1 - 0.01) ** -0.5)
    with pytest.raises(PrivacyConfigError, match="`count_noise_multiplier`"):
        update_noise_multiplier(1.0, 0.4)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (
            {"noise_multiplier": -1.0, "clipping_norm": 1.0, "expected_clients": 2},
            "`noise_multiplier`",
        ),
        ({"noise_multiplier": 1.0, "expected_clients": 2}, "exactly one"),
        ({"noise_multiplier": 1.0, "clipping_norm": 0.0, "expected_clients": 2}, "`clipping_norm`"),
        (
            {"noise_multiplier": 1.0, "clipping_norm": 1.0, "expected_clients": 0},
            "`expected_clients`",
        ),
    ],
)
def test_central_dp_validates_at_construction(kwargs, name) -> None:
    with pytest.raises(PrivacyConfigError, match=name):
        CentralDPAggregator(TEMPLATE, **kwargs)


def test_local_dp_calibration_and_noise() -> None:
    ldp = LocalDP(clipping_norm=1.0, epsilon=1.0, delta=1e-5)
    assert ldp.noise_multiplier == pytest.approx(np.sqrt(2 * np.log(1.25e5)))
    out = ldp.privatize(np.full(100_000, 10.0), np.random.default_rng(6))
    # Clipped to norm 1 (each coordinate 1/sqrt(1e5)), then noise of std ~4.84.
    assert out.std() == pytest.approx(ldp.noise_std, rel=0.02)
    assert abs(out.mean() - 1 / np.sqrt(1e5)) < 0.05
    with pytest.raises(PrivacyConfigError, match="`epsilon` must be <= 1"):
        LocalDP(clipping_norm=1.0, epsilon=2.0, delta=1e-5)
    with pytest.raises(PrivacyConfigError, match="either"):
        LocalDP(clipping_norm=1.0, epsilon=0.5, delta=1e-5, noise_multiplier=1.0)


def test_distributed_dp_under_secure_aggregation_gives_central_noise_level() -> None:
    n, d = 12, 20_000
    ddp = DistributedDP(noise_multiplier=1.0, clipping_norm=1.0, min_clients=10)
    rng = np.random.default_rng(7)
    base = np.zeros(d)
    noised = [ddp.privatize(base, np.random.default_rng([8, i])) for i in range(n)]
    clip_range = ddp.suggested_clipping_range(d)
    assert max(np.abs(v).max() for v in noised) < clip_range
    report = run_round(
        lambda i: noised[i],
        num_clients=n,
        vector_length=d,
        config=SecAggConfig(clipping_range=clip_range),
        dropouts=DropoutPlan.random(n, {Stage.MASKED_INPUT: 2 / n}, seed=1),
    )
    survivors = len(report.result.contributors)
    assert survivors == 10
    # The secure sum of 10 shares has std zC·sqrt(10/10) = 1.0 (the central level).
    assert report.result.sum.std() == pytest.approx(1.0, rel=0.03)
    np.testing.assert_allclose(
        report.result.sum, report.expected_sum, atol=report.result.error_bound
    )
    del rng
