"""The SecAgg+ neighbour graph: symmetric, k-regular, deterministic from the public seed."""

import pytest

from sporenet.federated.secagg.graph import neighbour_graph, neighbours_of


@pytest.mark.parametrize(("n", "k"), [(10, 4), (101, 20), (1000, 30), (7, 6), (8, 20)])
def test_graph_is_symmetric_regular_and_matches_single_rows(n: int, k: int) -> None:
    g = neighbour_graph(n, k, b"seed")
    degree = min(k, n - 1)
    for u, row in enumerate(g):
        assert len(row) == degree and u not in row
        for v in row:
            assert u in g[v]
    for u in (0, n // 2, n - 1):
        assert neighbours_of(u, n, k, b"seed") == g[u]


def test_graph_depends_only_on_the_seed() -> None:
    assert neighbour_graph(50, 6, b"a") == neighbour_graph(50, 6, b"a")
    assert neighbour_graph(50, 6, b"a") != neighbour_graph(50, 6, b"b")
