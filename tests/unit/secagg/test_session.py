"""SecureRound / SecureClientSession: named tensors, client ids, retries and persistence."""

import numpy as np
import pytest

from sporenet.federated.secagg import ProtocolError, SecAggConfig, SecAggConfigError, Stage
from sporenet.federated.secagg.session import (
    SecureClientSession,
    SecureRound,
    flatten,
    unflatten,
)

TEMPLATE = {"a": ((2, 3), np.dtype(np.float32)), "b": ((4,), np.dtype(np.float64))}
IDS = ["alice", "bob", "carol", "dave", "erin"]


def _update(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a": rng.normal(0, 0.2, (2, 3)).astype(np.float32), "b": rng.normal(0, 0.2, 4)}


def test_flatten_round_trips_and_checks_shapes() -> None:
    u = _update(0)
    back = unflatten(flatten(u, TEMPLATE), TEMPLATE)
    assert back["a"].dtype == np.float32 and back["a"].shape == (2, 3)
    np.testing.assert_allclose(back["b"], u["b"])
    with pytest.raises(ProtocolError, match=r"expected shape \(4,\)"):
        flatten({"a": u["a"], "b": np.zeros(5)}, TEMPLATE)
    with pytest.raises(ProtocolError, match="lacks tensor 'b'"):
        flatten({"a": u["a"]}, TEMPLATE)


def test_a_round_by_client_id_with_a_restart_and_a_resent_reply() -> None:
    rnd = SecureRound.start(SecAggConfig(), client_ids=IDS, template=TEMPLATE)
    sessions = {c: SecureClientSession(rnd.setup_payload(c), TEMPLATE) for c in IDS}
    updates = {c: _update(i) for i, c in enumerate(IDS)}
    for stage in (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK):
        assert rnd.stage == stage and rnd.pending() == IDS
        for c in IDS:
            payload = rnd.payload_for(c)
            reply = sessions[c].respond(stage, payload, updates[c])
            # A lost reply: asked again, the client resends the very same bytes.
            assert sessions[c].respond(stage, payload, updates[c]) == reply
            rnd.submit(c, reply)
            assert not rnd.expects(c)
        rnd = SecureRound.from_bytes(rnd.to_bytes())
        rnd.close_stage()
    mean, contributors = rnd.result()
    assert contributors == IDS
    for name in TEMPLATE:
        want = np.mean([updates[c][name] for c in IDS], axis=0)
        np.testing.assert_allclose(mean[name], want, atol=1e-6)
        assert mean[name].dtype == TEMPLATE[name][1]


def test_a_client_cannot_speak_for_another() -> None:
    rnd = SecureRound.start(SecAggConfig(), client_ids=IDS, template=TEMPLATE)
    bob = SecureClientSession(rnd.setup_payload("bob"), TEMPLATE)
    with pytest.raises(ProtocolError, match="sent a message as client index 1"):
        rnd.submit("alice", bob.respond(Stage.ADVERTISE_KEYS, b""))
    with pytest.raises(ProtocolError, match="not in this secure round"):
        rnd.setup_payload("mallory")
    with pytest.raises(ProtocolError, match="values"):
        SecureClientSession(rnd.setup_payload("bob"), {"a": ((3,), np.dtype(np.float32))})
    with pytest.raises(ProtocolError, match="distinct"):
        SecureRound.start(SecAggConfig(), client_ids=["x", "x"], template=TEMPLATE)


def test_weighted_round_gives_the_sample_weighted_mean_with_capped_weights() -> None:
    samples = {"alice": 10, "bob": 30, "carol": 60, "dave": 500, "erin": 1}
    rnd = SecureRound.start(SecAggConfig(), client_ids=IDS, template=TEMPLATE, max_weight=100)
    sessions = {c: SecureClientSession(rnd.setup_payload(c), TEMPLATE, max_weight=100) for c in IDS}
    updates = {c: _update(i) for i, c in enumerate(IDS)}
    for stage in (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASK):
        for c in IDS:
            rnd.submit(c, sessions[c].respond(stage, rnd.payload_for(c), updates[c], samples[c]))
        rnd.close_stage()
    rnd = SecureRound.from_bytes(rnd.to_bytes())
    mean, _ = rnd.result()
    w = {c: min(s, 100) / 100 for c, s in samples.items()}  # dave's 500 is capped at 100
    for name in TEMPLATE:
        want = sum(w[c] * updates[c][name] for c in IDS) / sum(w.values())
        np.testing.assert_allclose(mean[name], want, atol=1e-5)
    with pytest.raises(SecAggConfigError, match="`max_weight`"):
        SecureRound.start(SecAggConfig(), client_ids=IDS, template=TEMPLATE, max_weight=0)
    with pytest.raises(ProtocolError, match="weighted: False"):
        SecureClientSession(rnd.setup_payload("bob"), TEMPLATE)


def test_restart_from_a_stale_checkpoint_refolds_each_lost_upload_exactly_once() -> None:
    rnd = SecureRound.start(SecAggConfig(), client_ids=IDS, template=TEMPLATE)
    sessions = {c: SecureClientSession(rnd.setup_payload(c), TEMPLATE) for c in IDS}
    updates = {c: _update(i) for i, c in enumerate(IDS)}
    for stage in (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS):
        for c in IDS:
            rnd.submit(c, sessions[c].respond(stage, rnd.payload_for(c)))
        rnd.close_stage()
    checkpoint = b""
    for k, c in enumerate(IDS):
        rnd.submit(c, sessions[c].respond(Stage.MASKED_INPUT, rnd.payload_for(c), updates[c]))
        if k == 1:
            checkpoint = rnd.to_bytes()  # the last save before a crash
    rnd = SecureRound.from_bytes(checkpoint)
    assert rnd.pending() == IDS[2:]
    for c in rnd.pending():  # asked again: the same bytes come back
        rnd.submit(c, sessions[c].respond(Stage.MASKED_INPUT, rnd.payload_for(c), updates[c]))
    rnd.close_stage()
    for c in IDS:
        rnd.submit(c, sessions[c].respond(Stage.UNMASK, rnd.payload_for(c)))
    rnd.close_stage()
    mean, _ = rnd.result()
    for name in TEMPLATE:
        want = np.mean([updates[c][name] for c in IDS], axis=0)
        np.testing.assert_allclose(mean[name], want, atol=1e-6)
