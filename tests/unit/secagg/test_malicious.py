"""Malicious clients in a secure round: low-order keys are refused by name, tampered shares
are located and their sender excluded, and an unclipped input cannot push the sum past
what clipped inputs can add up to."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from sporenet.federated.secagg import (
    ProtocolError,
    ReconstructionError,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    Stage,
    ThresholdError,
    crypto,
)
from sporenet.federated.secagg.errors import ClientExcludedError, InvalidKeyError
from sporenet.federated.secagg.messages import (
    AdvertiseKeys,
    KeysBroadcast,
    MaskedInput,
    ShareKeys,
    UnmaskResponse,
)
from sporenet.federated.secagg.session import SecureRound
from sporenet.federated.secagg.simulation import DropoutPlan, run_round

P = 2**255 - 19
#: The u-coordinates of Curve25519's small-order points as the literature lists them
#: (cr.yp.to/ecdh.html, libsodium's blocklist), canonical and not, with bit 255 clear
#: and set: every 32-byte encoding whose X25519 output is all zeros.
LOW_ORDER = [
    0,
    1,
    325606250916557431795983626356110631294008115727848805560023387167927233504,
    39382357235489614581723060781553021112529911719440698176882885853963445705823,
    P - 1,
    P,
    P + 1,
]
ENCODINGS = [(u + high).to_bytes(32, "little") for u in LOW_ORDER for high in (0, 1 << 255)]


@pytest.mark.parametrize("key", ENCODINGS, ids=lambda k: k.hex()[:8] + k.hex()[-2:])
def test_each_listed_encoding_gives_the_all_zero_secret_and_is_refused(key: bytes) -> None:
    # The list is checked against the library: X25519 with it yields all zeros
    # (cryptography raises ValueError for exactly that output, RFC 7748 section 6.1).
    with pytest.raises(ValueError):
        X25519PrivateKey.generate().exchange(X25519PublicKey.from_public_bytes(key))
    assert crypto.low_order(key)
    with pytest.raises(InvalidKeyError, match="low-order"):
        crypto.check_public(key, "the key")


def test_ordinary_keys_are_not_refused() -> None:
    for _ in range(200):
        crypto.check_public(crypto.public_bytes(crypto.generate_private_key()), "a key")


def _server(n: int = 6, k: int = 4) -> SecAggServer:
    return SecAggServer(SecAggConfig(num_neighbours=k).resolve(n), vector_length=3)


@pytest.mark.parametrize("field", ["enc_public", "mask_public"])
@pytest.mark.parametrize("key", ENCODINGS, ids=lambda k: k.hex()[:8] + k.hex()[-2:])
def test_server_excludes_a_client_advertising_a_low_order_key(key: bytes, field: str) -> None:
    server = _server()
    good = crypto.public_bytes(crypto.generate_private_key())
    keys = {"enc_public": good, "mask_public": good, field: key}
    with pytest.raises(ClientExcludedError, match="client 3 is excluded") as info:
        server.receive(AdvertiseKeys(3, keys["enc_public"], keys["mask_public"]))
    assert info.value.client == 3 and field in info.value.reason
    assert server.excluded == {3: info.value.reason}
    assert 3 not in server.pending_clients()
    # It cannot come back with a valid key: it is out of the round.
    with pytest.raises(ClientExcludedError, match="client 3 was excluded"):
        server.receive(AdvertiseKeys(3, good, good))
    # The exclusion survives a restart.
    assert SecAggServer.from_bytes(server.to_bytes()).excluded == server.excluded


def _swap_mask_key(bad_client: int, key: bytes):
    def tamper(stage: Stage, client: int, wire: bytes) -> bytes:
        if stage != Stage.ADVERTISE_KEYS or client != bad_client:
            return wire
        msg = AdvertiseKeys.from_bytes(wire)
        return AdvertiseKeys(client, msg.enc_public, key).to_bytes()

    return tamper


@pytest.mark.parametrize("restart", [False, True])
def test_a_round_with_a_zero_key_client_completes_without_it(restart: bool) -> None:
    n, d = 10, 16
    xs = np.random.default_rng(1).uniform(-1, 1, (n, d))
    report = run_round(
        lambda i: xs[i],
        num_clients=n,
        vector_length=d,
        config=SecAggConfig(num_neighbours=8),
        tamper=_swap_mask_key(4, bytes(32)),
        restart_server=restart,
    )
    assert set(report.refused) == {4} and "mask_public" in report.refused[4]
    assert report.result.excluded == report.refused
    honest = [i for i in range(n) if i != 4]
    assert report.result.contributors == tuple(honest)
    np.testing.assert_allclose(
        report.result.sum, xs[honest].sum(axis=0), atol=report.result.error_bound
    )


def test_an_honest_client_refuses_a_low_order_peer_instead_of_withdrawing() -> None:
    server = _server(n=6, k=4)
    client = SecAggClient(server.setup_for(0))
    client.advertise_keys()
    peers = sorted(client.neighbours)
    keys = {}
    for v in peers:
        key = crypto.public_bytes(crypto.generate_private_key())
        keys[v] = (key, key)
    bad = peers[1]
    keys[bad] = (keys[bad][0], ENCODINGS[2])
    reply = client.share_keys(KeysBroadcast(keys))
    assert set(reply.ciphertexts) == set(peers) - {bad}
    assert set(client.refused_peers) == {bad} and "low-order" in client.refused_peers[bad]


def _corrupt_shares(bad_clients: set[int]):
    """Every share a bad client reveals at unmask is off by one in one chunk."""

    def flip(share: bytes) -> bytes:
        return bytes([share[0] ^ 1]) + share[1:]

    def tamper(stage: Stage, client: int, wire: bytes) -> bytes:
        if stage != Stage.UNMASK or client not in bad_clients:
            return wire
        msg = UnmaskResponse.from_bytes(wire)
        return UnmaskResponse(
            client,
            {v: flip(s) for v, s in msg.key_shares.items()},
            {v: flip(s) for v, s in msg.self_mask_shares.items()},
        ).to_bytes()

    return tamper


@pytest.mark.parametrize("restart", [False, True])
def test_tampered_shares_are_located_and_their_sender_excluded(restart: bool) -> None:
    # n = 10, k = 8, t = 5: each secret has up to 8 shares, which correct 1 bad one. Client 7
    # drops before uploading, so its mask key is rebuilt from shares too.
    n, d = 10, 16
    xs = np.random.default_rng(2).uniform(-1, 1, (n, d))
    report = run_round(
        lambda i: xs[i],
        num_clients=n,
        vector_length=d,
        config=SecAggConfig(num_neighbours=8, threshold=5),
        dropouts=DropoutPlan(at_stage={Stage.MASKED_INPUT: frozenset({7})}),
        tamper=_corrupt_shares({2}),
        restart_server=restart,
        graph_seed=b"fixed",
    )
    result = report.result
    assert set(result.excluded) == {2}
    assert "disagrees with the other" in result.excluded[2]
    # Client 2 uploaded its masked input before it misbehaved: it stays in the sum.
    assert result.contributors == tuple(i for i in range(n) if i != 7)
    np.testing.assert_allclose(
        result.sum, xs[list(result.contributors)].sum(axis=0), atol=result.error_bound
    )


def test_too_many_tampered_shares_fail_with_the_exact_limit() -> None:
    # Complete graph of 8 (k = 7, t = 5): 7 shares per secret correct one bad share; two
    # tampering holders are beyond that, and the error says so.
    with pytest.raises(ReconstructionError, match=r"7 shares .* correct at most 1 bad share"):
        run_round(
            lambda i: np.zeros(4),
            num_clients=8,
            vector_length=4,
            config=SecAggConfig(threshold=5),
            tamper=_corrupt_shares({1, 2}),
        )


def test_exactly_threshold_shares_cannot_locate_a_bad_one_and_say_so() -> None:
    # Complete graph of 4 with t = k = 3: every secret has exactly t shares.
    with pytest.raises(ReconstructionError, match=r"exactly t = 3 shares arrived.*t \+ 2 = 5"):
        run_round(
            lambda i: np.zeros(4),
            num_clients=4,
            vector_length=4,
            config=SecAggConfig(threshold=3),
            tamper=_corrupt_shares({2}),
        )


def test_masks_still_cancel_exactly_with_a_tamperer_and_dropouts() -> None:
    # Values on the quantization grid encode without rounding, so the decoded sum must be
    # the integer sum of levels exactly: any mask residue or wrong secret would show.
    n, d = 12, 200
    config = SecAggConfig(num_neighbours=10, threshold=6)
    params = config.resolve(n)
    step = params.clipping_range / (2 ** (params.quantization_bits - 1) - 1)
    levels = np.random.default_rng(3).integers(-1000, 1000, (n, d))
    report = run_round(
        lambda i: levels[i] * step,
        num_clients=n,
        vector_length=d,
        config=config,
        dropouts=DropoutPlan(
            at_stage={Stage.MASKED_INPUT: frozenset({5}), Stage.UNMASK: frozenset({9})}
        ),
        tamper=_corrupt_shares({3}),
    )
    assert set(report.result.excluded) == {3}
    want = levels[list(report.result.contributors)].sum(axis=0)
    np.testing.assert_array_equal(np.rint(report.result.sum / step).astype(np.int64), want)
    np.testing.assert_allclose(report.result.sum, want * step, rtol=0, atol=1e-9)


def test_an_unclipped_input_is_clamped_to_what_clipped_inputs_can_sum_to() -> None:
    # Adding 3·2^29 ring units to one masked vector (n = 4, 29 quantization bits) would
    # move coordinate 0 of the mean by 1.5 clipping ranges; the sum is held to 4 inputs'
    # bound and the count of clamped coordinates reported.
    n, d = 4, 8
    xs = np.random.default_rng(4).uniform(-0.1, 0.1, (n, d))

    def tamper(stage: Stage, client: int, wire: bytes) -> bytes:
        if stage != Stage.MASKED_INPUT or client != 1:
            return wire
        msg = MaskedInput.from_bytes(wire)
        v = msg.vector.copy()
        v[:1] += np.uint32(3 << 29)  # wraps mod 2^32 like the ring
        return MaskedInput(client, v).to_bytes()

    report = run_round(
        lambda i: xs[i], num_clients=n, vector_length=d, config=SecAggConfig(), tamper=tamper
    )
    result = report.result
    assert result.out_of_range == 1
    assert result.sum[0] == pytest.approx(n * 1.0)  # the bound: n inputs at +clipping_range
    np.testing.assert_allclose(result.sum[1:], xs.sum(axis=0)[1:], atol=result.error_bound)


def test_secure_round_names_excluded_clients_by_id() -> None:
    ids = [f"c{i}" for i in range(6)]
    r = SecureRound.start(
        SecAggConfig(num_neighbours=4), client_ids=ids, template={"w": ((3,), np.float32)}
    )
    good = crypto.public_bytes(crypto.generate_private_key())
    with pytest.raises(ClientExcludedError, match="'c2' is excluded") as info:
        r.submit("c2", AdvertiseKeys(2, good, bytes(32)).to_bytes())
    assert info.value.client == "c2"
    assert r.excluded() == {"c2": info.value.reason}
    assert "c2" not in r.pending()
    assert SecureRound.from_bytes(r.to_bytes()).excluded() == r.excluded()


def test_random_keys_pass_the_advertise_check() -> None:
    server = _server()
    for u in range(6):
        server.receive(
            AdvertiseKeys(
                u,
                crypto.public_bytes(crypto.generate_private_key()),
                crypto.public_bytes(X25519PrivateKey.from_private_bytes(os.urandom(32))),
            )
        )
    assert server.excluded == {} and server.pending_clients() == frozenset()


def _garble_ciphertexts(bad_client: int, how_many: int):
    """The bad client's share ciphertexts to its first `how_many` peers are altered."""

    def tamper(stage: Stage, client: int, wire: bytes) -> bytes:
        if stage != Stage.SHARE_KEYS or client != bad_client:
            return wire
        msg = ShareKeys.from_bytes(wire)
        cts = dict(msg.ciphertexts)
        for peer in sorted(cts)[:how_many]:
            cts[peer] = cts[peer][:-1] + bytes([cts[peer][-1] ^ 1])
        return ShareKeys(client, cts, msg.self_mask_digest).to_bytes()

    return tamper


def test_garbled_share_ciphertexts_are_refused_by_their_recipients_and_reported() -> None:
    # k = 8, t = 5: client 3 garbles its shares to 3 peers, who refuse them (before, each
    # withdrew); its secrets keep 5 holders and the round completes with everyone.
    n, d = 10, 8
    xs = np.random.default_rng(6).uniform(-1, 1, (n, d))
    report = run_round(
        lambda i: xs[i],
        num_clients=n,
        vector_length=d,
        config=SecAggConfig(num_neighbours=8, threshold=5),
        tamper=_garble_ciphertexts(3, 3),
        restart_server=True,
    )
    assert report.result.contributors == tuple(range(n))
    assert len(report.complaints) == 3
    assert all(of == frozenset({3}) for of in report.complaints.values())
    np.testing.assert_allclose(report.result.sum, xs.sum(axis=0), atol=report.result.error_bound)


def test_too_many_garbled_ciphertexts_fail_the_run_naming_sender_and_recipients() -> None:
    with pytest.raises(ThresholdError, match=r"client 3's self-mask seed has 4 .*could not "):
        run_round(
            lambda i: np.zeros(4),
            num_clients=10,
            vector_length=4,
            config=SecAggConfig(num_neighbours=8, threshold=5),
            tamper=_garble_ciphertexts(3, 4),
        )


def test_masked_input_carries_refused_peers_and_the_server_checks_them() -> None:
    msg = MaskedInput(2, np.arange(5, dtype=np.uint32), (1, 3))
    back = MaskedInput.from_bytes(msg.to_bytes())
    assert back.refused == (1, 3) and back.vector.tolist() == list(range(5))
    assert MaskedInput.from_bytes(MaskedInput(2, np.zeros(3, np.uint32)).to_bytes()).refused == ()
    with pytest.raises(ProtocolError, match="declares"):
        MaskedInput.from_bytes(msg.to_bytes()[:-2])
    # A refusal of a peer that sent the client nothing is malformed.
    server = _server(n=6, k=4)
    for u in range(6):
        key = crypto.public_bytes(crypto.generate_private_key())
        server.receive(AdvertiseKeys(u, key, key))
    server.close_stage()
    for u in range(6):
        peers = sorted(server.message_for(u).keys)  # type: ignore[attr-defined]
        server.receive(ShareKeys(u, dict.fromkeys(peers, b"x" * 40), bytes(32)))
    server.close_stage()
    stranger = next(v for v in range(6) if v != 0 and v not in server.neighbours[0])
    with pytest.raises(ProtocolError, match="refused shares of clients"):
        server.receive(MaskedInput(0, np.zeros(3, np.uint32), (stranger,)))


def test_secure_round_names_complaints_by_id() -> None:
    ids = [f"c{i}" for i in range(6)]
    r = SecureRound.start(
        SecAggConfig(num_neighbours=4), client_ids=ids, template={"w": ((3,), np.float32)}
    )
    r.server.complaints = {1: frozenset({0, 2})}
    assert r.complaints() == {"c1": ["c0", "c2"]}
    assert SecureRound.from_bytes(r.to_bytes()).complaints() == r.complaints()
