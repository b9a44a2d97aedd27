"""Every strategy against a direct NumPy (or plain Python) computation."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sporenet.federated.aggregation import BufferedAggregator, WeightedMeanAggregator, template_of
from sporenet.federated.errors import AggregationError, ConfigError
from sporenet.federated.strategies import (
    STRATEGIES,
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedProx,
    FedYogi,
    coordinate_median,
    krum,
    krum_scores,
    make_strategy,
    trimmed_mean,
    weighted_mean,
)


def _updates(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "w": rng.standard_normal((3, 4)).astype(np.float32),
            "b": rng.standard_normal(3).astype(np.float32),
        }
        for _ in range(n)
    ]


def test_fedavg_running_mean_equals_numpy_average() -> None:
    ups, weights = _updates(5), [3.0, 1.0, 7.0, 2.0, 5.0]
    agg = WeightedMeanAggregator(template_of(ups[0]))
    for i, (u, w) in enumerate(zip(ups, weights, strict=True)):
        agg.add(f"c{i}", u, w)
    got = agg.result()
    for k in ("w", "b"):
        want = np.average(np.stack([u[k] for u in ups]), axis=0, weights=weights)
        np.testing.assert_allclose(got[k], want, rtol=1e-6)
        np.testing.assert_allclose(weighted_mean(ups, weights)[k], want, rtol=1e-6)
        assert got[k].dtype == np.float32


def test_running_mean_checkpoint_restores_exactly() -> None:
    ups = _updates(4)
    a = WeightedMeanAggregator(template_of(ups[0]))
    a.add("x", ups[0], 2.0)
    a.add("y", ups[1], 1.0)
    b = WeightedMeanAggregator(template_of(ups[0]))
    b.restore(a.snapshot())
    assert b.clients == ["x", "y"]
    for agg in (a, b):
        agg.add("z", ups[2], 4.0)
    for k in ("w", "b"):
        np.testing.assert_array_equal(a.result()[k], b.result()[k])
    for agg in (a, b):  # a restored aggregator knows who is folded in too
        with pytest.raises(AggregationError, match="already folded"):
            agg.add("x", ups[3], 1.0)
    with pytest.raises(AggregationError, match="weight must be"):
        a.add("q", ups[3], 0.0)
    with pytest.raises(AggregationError, match="no updates"):
        WeightedMeanAggregator(template_of(ups[0])).result()


@settings(max_examples=25, deadline=None)
@given(st.permutations(list(range(6))))
def test_running_mean_does_not_depend_on_arrival_order(order: list[int]) -> None:
    ups, weights = _updates(6, seed=3), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    agg = WeightedMeanAggregator(template_of(ups[0]))
    for i in order:
        agg.add(str(i), ups[i], weights[i])
    want = np.average(np.stack([u["w"] for u in ups]), axis=0, weights=weights)
    np.testing.assert_allclose(agg.result()["w"], want, rtol=1e-6)


def test_fedavg_and_fedprox_apply_and_config() -> None:
    w = {"w": np.ones((2, 2), np.float32)}
    d = {"w": np.full((2, 2), 0.5, np.float32)}
    new, state = FedAvg().apply(w, d, {})
    np.testing.assert_array_equal(new["w"], np.full((2, 2), 1.5, np.float32))
    assert state == {}
    assert FedProx(proximal_mu=0.3).fit_config(1) == {"proximal_mu": 0.3}
    with pytest.raises(ConfigError, match="proximal_mu"):
        FedProx(proximal_mu=-1)


def _reference_fedopt(
    kind: str,
    w0: np.ndarray,
    deltas: list[np.ndarray],
    eta: float,
    b1: float,
    b2: float,
    tau: float,
) -> np.ndarray:
    """Reddi et al. written out element by element, independent of the implementation."""
    w = w0.astype(np.float64).ravel().tolist()
    m = [0.0] * len(w)
    v = [0.0] * len(w)
    for t, d in enumerate(deltas, start=1):
        for j, dj in enumerate(d.astype(np.float64).ravel().tolist()):
            m[j] = b1 * m[j] + (1 - b1) * dj
            if kind == "adagrad":
                v[j] = v[j] + dj * dj
            elif kind == "adam":
                v[j] = b2 * v[j] + (1 - b2) * dj * dj
            else:
                diff = v[j] - dj * dj
                v[j] = v[j] - (1 - b2) * dj * dj * (1 if diff > 0 else -1 if diff < 0 else 0)
            lr = eta * (1 - b2**t) ** 0.5 / (1 - b1**t) if kind == "adam" else eta
            w[j] = w[j] + lr * m[j] / (v[j] ** 0.5 + tau)
    return np.array(w).reshape(w0.shape)


@pytest.mark.parametrize(
    ("cls", "kind"), [(FedAdam, "adam"), (FedYogi, "yogi"), (FedAdagrad, "adagrad")]
)
def test_server_optimizers_match_the_paper(cls: type, kind: str) -> None:
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    deltas = [rng.standard_normal((3, 2)).astype(np.float32) * 0.1 for _ in range(3)]
    strategy = cls(eta=0.05, beta1=0.8, beta2=0.95, tau=1e-3)
    w, state = {"w": w0}, {}
    for d in deltas:
        w, state = strategy.apply(w, {"w": d}, state)
    want = _reference_fedopt(kind, w0, deltas, 0.05, 0.8, 0.95, 1e-3)
    np.testing.assert_allclose(w["w"], want, rtol=1e-5, atol=1e-6)
    assert int(state["meta/step"]) == 3


def test_fedavgm_steps_along_the_momentum_of_the_mean_deltas() -> None:
    """v = momentum * v + delta, w = w + eta * v, per coordinate in plain Python; with no
    momentum and eta 1 it is FedAvg's step."""
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal((2, 3)).astype(np.float32)
    deltas = [rng.standard_normal((2, 3)).astype(np.float32) * 0.1 for _ in range(4)]
    w, state = {"w": w0}, {}
    strategy = FedAvgM(eta=0.7, momentum=0.8)
    for d in deltas:
        w, state = strategy.apply(w, {"w": d}, state)
    want, v = [float(x) for x in w0.ravel()], [0.0] * w0.size
    for d in deltas:
        for j, dj in enumerate(d.ravel()):
            v[j] = 0.8 * v[j] + float(dj)
            want[j] += 0.7 * v[j]
    np.testing.assert_allclose(w["w"], np.reshape(want, w0.shape), rtol=1e-5, atol=1e-6)
    plain, _ = FedAvgM(eta=1.0, momentum=0.0).apply({"w": w0}, {"w": deltas[0]}, {})
    fedavg, _ = FedAvg().apply({"w": w0}, {"w": deltas[0]}, {})
    np.testing.assert_array_equal(plain["w"], fedavg["w"])
    with pytest.raises(ConfigError, match="`momentum` must be in \\[0, 1\\), got 1"):
        make_strategy("fedavgm", {"momentum": 1})


def test_trimmed_mean_matches_per_coordinate_python() -> None:
    ups = _updates(7, seed=5)
    ups[0]["w"][0, 0] = 1e6  # an outlier the trim must remove
    got = trimmed_mean(ups, 0.2)  # trims 1 from each end of 7
    for idx in np.ndindex(3, 4):
        values = sorted(float(u["w"][idx]) for u in ups)[1:-1]
        assert got["w"][idx] == pytest.approx(sum(values) / len(values), rel=1e-5)
    assert abs(float(got["w"][0, 0])) < 10
    with pytest.raises(AggregationError, match="leaves nothing"):
        trimmed_mean(ups[:2], 0.49 + 0.01)
    with pytest.raises(ConfigError, match="beta"):
        make_strategy("trimmed_mean", {"beta": 0.5})


def test_coordinate_median_matches_statistics_median() -> None:
    for n in (4, 5):  # even and odd counts
        ups = _updates(n, seed=n)
        got = coordinate_median(ups)
        for idx in np.ndindex(3):
            assert got["b"][idx] == pytest.approx(
                statistics.median(float(u["b"][idx]) for u in ups), rel=1e-6
            )


def test_krum_and_multi_krum_match_brute_force() -> None:
    ups = _updates(6, seed=9)
    ups[2] = {k: v + 50 for k, v in ups[2].items()}  # a Byzantine update far from the rest
    f = 1
    flat = [np.concatenate([u["w"].ravel(), u["b"].ravel()]).astype(np.float64) for u in ups]
    scores = []
    for i in range(6):
        d = sorted(float(((flat[i] - flat[j]) ** 2).sum()) for j in range(6) if j != i)
        scores.append(sum(d[: 6 - f - 2]))
    np.testing.assert_allclose(krum_scores(ups, f), scores, rtol=1e-9)
    best = int(np.argmin(scores))
    got = krum(ups, np.ones(6), num_malicious=f)
    np.testing.assert_allclose(got["w"], ups[best]["w"], rtol=1e-6)
    weights = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    top3 = np.argsort(scores)[:3]
    assert 2 not in top3
    multi = krum(ups, weights, num_malicious=f, num_selected=3)
    want = np.average(np.stack([ups[i]["w"] for i in top3]), axis=0, weights=weights[top3])
    np.testing.assert_allclose(multi["w"], want, rtol=1e-5)
    with pytest.raises(AggregationError, match="n > f \\+ 2"):
        krum_scores(ups[:3], 1)


def test_buffered_strategies_aggregate_through_the_stage_and_checkpoint() -> None:
    ups = _updates(5, seed=2)
    for name, options, reference in [
        ("median", {}, lambda: coordinate_median(ups)),
        ("trimmed_mean", {"beta": 0.2}, lambda: trimmed_mean(ups, 0.2)),
        (
            "krum",
            {"num_malicious": 1, "num_selected": 2},
            lambda: krum(ups, np.arange(1.0, 6.0), num_malicious=1, num_selected=2),
        ),
    ]:
        agg = make_strategy(name, options).make_aggregator(template_of(ups[0]))
        assert isinstance(agg, BufferedAggregator)
        for i, u in enumerate(ups[:3]):
            agg.add(f"c{i}", u, float(i + 1))
        resumed = make_strategy(name, options).make_aggregator(template_of(ups[0]))
        resumed.restore(agg.snapshot())
        for i, u in enumerate(ups[3:], start=3):
            resumed.add(f"c{i}", u, float(i + 1))
        want = reference()
        for k in ("w", "b"):
            np.testing.assert_allclose(resumed.result()[k], want[k], rtol=1e-6)


def test_make_strategy_names_what_is_wrong() -> None:
    with pytest.raises(ConfigError, match="unknown strategy 'fedsgd'; supported: \\['fedadagrad'"):
        make_strategy("fedsgd")
    with pytest.raises(ConfigError, match="no option\\(s\\) \\['mu'\\]"):
        make_strategy("fedprox", {"mu": 0.1})
    with pytest.raises(ConfigError, match="`eta` is out of range"):
        make_strategy("fedadam", {"eta": 0})


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_needs_individual_updates_says_whether_a_sum_is_enough(name: str) -> None:
    """Secure aggregation and DP reveal only a weighted sum: exactly the strategies that
    aggregate by the running weighted mean may say they do not need individual updates."""
    strategy = make_strategy(name, {})
    template = {"w": ((3,), np.dtype(np.float32))}
    by_mean = isinstance(strategy.make_aggregator(template), WeightedMeanAggregator)
    assert strategy.needs_individual_updates is not by_mean
