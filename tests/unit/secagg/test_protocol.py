"""Full secure rounds in process: correct sums under dropouts and restarts, failures that
are loud and typed, and clients that refuse to expose a peer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sporenet.federated.secagg import (
    ProtocolError,
    ReconstructionError,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    Stage,
    ThresholdError,
    UnmaskRefusedError,
)
from sporenet.federated.secagg.messages import (
    AdvertiseKeys,
    MaskedInput,
    ShareKeys,
    UnmaskRequest,
    UnmaskResponse,
    b64,
)
from sporenet.federated.secagg.simulation import STAGES, DropoutPlan, run_round


def _updates(n: int, d: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.5, 1.5, size=(n, d))


def _expected_outcome(n: int, k: int, t: int, seed: bytes, plan: DropoutPlan) -> frozenset | None:
    """An independent statement of who contributes, or None if the round must fail."""
    from sporenet.federated.secagg.graph import neighbour_graph

    g = [set(r) for r in neighbour_graph(n, k, seed)]

    def prune(alive: set[int]) -> set[int]:
        while True:
            starving = {u for u in alive if len(g[u] & alive) < t}
            if not starving:
                return alive
            alive = alive - starving

    u1 = prune(set(range(n)) - plan.silent(Stage.ADVERTISE_KEYS))
    if len(u1) < t:
        return None
    u2 = prune(u1 - plan.silent(Stage.SHARE_KEYS))
    if len(u2) < t:
        return None
    u3 = u2 - plan.silent(Stage.MASKED_INPUT)
    if len(u3) < t:
        return None
    u4 = u3 - plan.silent(Stage.UNMASK)
    for u in u2:
        if (u in u3 or g[u] & u3) and (len(g[u] & u3) < t or len(g[u] & u4) < t):
            return None
    return frozenset(u3)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(3, 14),
    half_k=st.integers(1, 5),
    extra_t=st.integers(0, 3),
    stages=st.lists(st.sampled_from([*STAGES, None]), min_size=14, max_size=14),
    drop_rate=st.sampled_from([0.0, 0.15, 0.35]),
    restart=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_secure_sum_matches_plain_sum_or_round_fails_typed(
    n, half_k, extra_t, stages, drop_rate, restart, seed
) -> None:
    k = min(2 * half_k, (n - 1) - (n - 1) % 2)  # an even degree the round can have
    t = min(k // 2 + 1 + extra_t, k)
    config = SecAggConfig(num_neighbours=k, threshold=t, clipping_range=1.0)
    rng = np.random.default_rng(seed)
    plan = DropoutPlan(
        at_stage={
            s: frozenset(i for i in range(n) if stages[i] == s and rng.random() < drop_rate)
            for s in STAGES
        }
    )
    xs = _updates(n, 8, seed)
    graph_seed = seed.to_bytes(4, "big")
    try:
        report = run_round(
            lambda i: xs[i],
            num_clients=n,
            vector_length=8,
            config=config,
            dropouts=plan,
            restart_server=restart,
            seed=seed,
            graph_seed=graph_seed,
        )
        outcome: frozenset | None = frozenset(report.result.contributors)
    except ThresholdError:
        outcome = None
    # Succeeds exactly when the protocol's survival rules allow, with exactly U3 summed.
    assert outcome == _expected_outcome(n, k, t, graph_seed, plan)
    if outcome is not None:
        want = np.clip(xs[sorted(outcome)], -1, 1).sum(axis=0)
        assert np.all(np.abs(report.result.sum - want) < report.result.error_bound)


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize(
    ("n", "k", "t", "rates"),
    [
        (12, 4, 3, {Stage.MASKED_INPUT: 0.1}),
        (20, 8, 5, {Stage.SHARE_KEYS: 0.1, Stage.MASKED_INPUT: 0.1, Stage.UNMASK: 0.1}),
        (20, 8, 5, {Stage.ADVERTISE_KEYS: 0.3}),  # the pruning cascade empties the round
        (40, 12, 7, {Stage.ADVERTISE_KEYS: 0.1, Stage.SHARE_KEYS: 0.1, Stage.UNMASK: 0.1}),
        (30, 10, 6, {Stage.MASKED_INPUT: 0.3}),
        (30, 10, 6, {Stage.UNMASK: 0.3}),
        (9, 8, 5, {Stage.MASKED_INPUT: 0.5}),  # complete graph, too few left: fails
        (10, 4, 3, {Stage.SHARE_KEYS: 0.6}),
    ],
)
def test_outcome_matches_an_independent_oracle(n, k, t, rates, restart) -> None:
    plan = DropoutPlan.random(n, rates, seed=n + k)
    xs = _updates(n, 32, 7)
    config = SecAggConfig(num_neighbours=k, threshold=t)
    graph_seed = f"case {n} {k} {t}".encode()  # reproducible; the oracle sees the same graph
    outcome: frozenset | None
    try:
        report = run_round(
            lambda i: xs[i],
            num_clients=n,
            vector_length=32,
            config=config,
            dropouts=plan,
            restart_server=restart,
            graph_seed=graph_seed,
        )
        outcome = frozenset(report.result.contributors)
    except ThresholdError:
        outcome = None
    assert outcome == _expected_outcome(n, min(k, n - 1), t, graph_seed, plan)
    if outcome is not None:
        want = np.clip(xs[sorted(outcome)], -1, 1).sum(axis=0)
        assert np.all(np.abs(report.result.sum - want) < report.result.error_bound)


def test_masks_cancel_exactly_on_zero_updates() -> None:
    # Zero encodes to exactly 0 (floor(0 + u) = 0), so any mask residue would show.
    plan = DropoutPlan.random(25, {Stage.MASKED_INPUT: 0.2, Stage.UNMASK: 0.1}, seed=3)
    report = run_round(
        lambda i: np.zeros(1000),
        num_clients=25,
        vector_length=1000,
        config=SecAggConfig(num_neighbours=12),
        dropouts=plan,
        graph_seed=b"fixed graph",  # dropouts vs a fixed graph: a deterministic outcome
    )
    assert np.array_equal(report.result.sum, np.zeros(1000))
    assert len(report.result.contributors) == 20


def test_sixty_four_bit_ring_and_non_native_modulus() -> None:
    xs = _updates(10, 50, 1)
    for bits in (20, 64):
        report = run_round(
            lambda i: xs[i],
            num_clients=10,
            vector_length=50,
            config=SecAggConfig(modulus_bits=bits, clipping_range=2.0),
            dropouts=DropoutPlan.random(10, {Stage.MASKED_INPUT: 0.1}),
        )
        want = xs[list(report.result.contributors)].sum(axis=0)
        assert np.all(np.abs(report.result.sum - want) < report.result.error_bound)


def test_too_few_survivors_fail_with_a_clear_error_and_the_state_remembers() -> None:
    config = SecAggConfig(num_neighbours=4, threshold=3)
    server = SecAggServer.start(config, num_clients=6, vector_length=4)
    clients = [SecAggClient(server.setup_for(i)) for i in range(6)]
    for c in clients[:2]:
        server.receive(c.advertise_keys())
    with pytest.raises(ThresholdError, match="threshold is 3"):
        server.close_stage()
    restored = SecAggServer.from_bytes(server.to_bytes())
    assert restored.stage == Stage.FAILED
    with pytest.raises(ThresholdError, match="failed"):
        restored.result()


def _round_to_unmask(n: int = 6, k: int = 4, t: int = 3):
    server = SecAggServer.start(
        SecAggConfig(num_neighbours=k, threshold=t), num_clients=n, vector_length=4
    )
    clients = [SecAggClient(server.setup_for(i)) for i in range(n)]
    for c in clients:
        server.receive(c.advertise_keys())
    server.close_stage()
    for c in clients:
        server.receive(c.share_keys(server.message_for(c.index)))
    server.close_stage()
    for c in clients:
        server.receive(c.masked_input(server.message_for(c.index), np.ones(4) * 0.5))
    server.close_stage()
    return server, clients


def test_honest_client_never_reveals_both_secrets_of_a_peer() -> None:
    _, clients = _round_to_unmask()
    c = clients[0]
    peers = sorted(c.neighbours)
    with pytest.raises(UnmaskRefusedError, match="both dropped and surviving"):
        c.unmask(UnmaskRequest(dropped=(peers[0],), survivors=tuple(peers)))
    first = c.unmask(UnmaskRequest(dropped=(), survivors=tuple(peers)))
    assert set(first.self_mask_shares) == set(peers) and not first.key_shares
    # A second request that now calls a peer "dropped" asks for its other secret.
    with pytest.raises(UnmaskRefusedError, match="already revealed"):
        c.unmask(UnmaskRequest(dropped=(peers[0],), survivors=tuple(peers[1:])))
    # Asking for survivors' shares only is idempotent (a restarted server may re-ask).
    assert c.unmask(UnmaskRequest(dropped=(), survivors=tuple(peers))) == first


def test_client_refuses_an_unmask_with_too_few_survivors() -> None:
    _, clients = _round_to_unmask()
    c = clients[0]
    peers = sorted(c.neighbours)
    with pytest.raises(UnmaskRefusedError, match="threshold is 3"):
        c.unmask(UnmaskRequest(dropped=tuple(peers[1:]), survivors=(peers[0],)))


def test_completed_round_and_restart_mid_unmask() -> None:
    server, clients = _round_to_unmask()
    server.receive(clients[0].unmask(server.message_for(0)))
    server = SecAggServer.from_bytes(server.to_bytes())
    assert server.pending_clients() == frozenset(range(1, 6))
    with pytest.raises(ProtocolError, match="already sent"):
        server.receive(clients[0].unmask(server.message_for(0)))
    for c in clients[1:]:
        server.receive(c.unmask(server.message_for(c.index)))
    server.close_stage()
    done = SecAggServer.from_bytes(server.to_bytes())
    assert done.stage == Stage.COMPLETED
    np.testing.assert_allclose(done.result().sum, np.full(4, 3.0), atol=done.result().error_bound)
    np.testing.assert_allclose(done.result().mean, np.full(4, 0.5), atol=1e-6)


def test_tampered_share_ciphertext_is_detected_by_the_recipient() -> None:
    victims: list[int] = []

    def tamper(stage, client, wire):
        if stage == Stage.SHARE_KEYS and client == 0:
            msg = ShareKeys.from_bytes(wire)
            victim = min(msg.ciphertexts)
            victims.append(victim)
            ct = bytearray(msg.ciphertexts[victim])
            ct[-1] ^= 1
            return ShareKeys(
                0, {**msg.ciphertexts, victim: bytes(ct)}, msg.self_mask_digest
            ).to_bytes()
        return wire

    # The recipient refuses client 0's shares instead of withdrawing; the round completes
    # with 4 - 1 = 3 = t holders of client 0's secrets, and the complaint is on record.
    report = run_round(
        lambda i: np.ones(4) * 0.5,
        num_clients=8,
        vector_length=4,
        config=SecAggConfig(num_neighbours=4),
        tamper=tamper,
    )
    assert report.result.contributors == tuple(range(8))
    assert report.complaints == {victims[0]: frozenset({0})}
    np.testing.assert_allclose(report.result.sum, np.full(4, 4.0), atol=report.result.error_bound)


def test_corrupted_unmask_shares_never_yield_a_wrong_sum() -> None:
    def tamper(stage, client, wire):
        if stage != Stage.UNMASK:
            return wire
        msg = UnmaskResponse.from_bytes(wire)
        bad = {v: bytes([s[0] ^ 1]) + s[1:] for v, s in msg.self_mask_shares.items()}
        return UnmaskResponse(client, msg.key_shares, bad).to_bytes()

    with pytest.raises(ReconstructionError):
        run_round(
            lambda i: np.zeros(4),
            num_clients=8,
            vector_length=4,
            config=SecAggConfig(num_neighbours=4),
            tamper=tamper,
        )


def test_server_rejects_out_of_stage_duplicate_and_malformed_messages() -> None:
    server = SecAggServer.start(SecAggConfig(num_neighbours=4), num_clients=6, vector_length=4)
    clients = [SecAggClient(server.setup_for(i)) for i in range(6)]
    keys = clients[0].advertise_keys()
    server.receive(keys)
    with pytest.raises(ProtocolError, match="already sent"):
        server.receive(keys)
    with pytest.raises(ProtocolError, match="does not accept MaskedInput"):
        server.receive(MaskedInput(1, np.zeros(4, np.uint32)))
    with pytest.raises(ProtocolError, match="not active"):
        server.receive(AdvertiseKeys(99, bytes(32), bytes(32)))
    with pytest.raises(ProtocolError, match="32 bytes"):
        server.receive(AdvertiseKeys(1, b"x", bytes(32)))
    with pytest.raises(ProtocolError, match="client index"):
        server.setup_for(6)
    for c in clients[1:]:
        server.receive(c.advertise_keys())
    server.close_stage()
    share = clients[0].share_keys(server.message_for(0))
    with pytest.raises(ProtocolError, match="expected exactly"):
        server.receive(
            ShareKeys(0, dict(list(share.ciphertexts.items())[:-1]), share.self_mask_digest)
        )
    with pytest.raises(ProtocolError, match="expected the 'share' step"):
        clients[0].share_keys(server.message_for(0))


def test_wire_messages_round_trip_and_reject_garbage() -> None:
    v = MaskedInput(3, np.arange(5, dtype=np.uint32))
    back = MaskedInput.from_bytes(v.to_bytes())
    assert back.client == 3 and np.array_equal(back.vector, v.vector)
    assert len(v.to_bytes()) == 5 * 4 + 13
    with pytest.raises(ProtocolError, match="carries"):
        MaskedInput.from_bytes(v.to_bytes()[:-1])
    r = UnmaskResponse(1, {2: b"ab"}, {3: b"cd"})
    assert UnmaskResponse.from_bytes(r.to_bytes()) == r
    with pytest.raises(ProtocolError, match="expected a ShareKeys"):
        ShareKeys.from_bytes(r.to_bytes())
    with pytest.raises(ProtocolError, match="not valid JSON"):
        ShareKeys.from_bytes(b"\xff")
    bad = json.dumps(
        {"type": "AdvertiseKeys", "client": "1", "enc_public": b64(b"k"), "mask_public": b64(b"k")}
    ).encode()
    with pytest.raises(ProtocolError, match="must be an int"):
        AdvertiseKeys.from_bytes(bad)
    with pytest.raises(ProtocolError, match=r"not a secure aggregation state|corrupt"):
        SecAggServer.from_bytes(b"SASV" + bytes(12) + b"{}")
