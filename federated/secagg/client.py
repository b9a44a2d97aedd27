"""The client side of one secure round: four steps, each answering one server message.

The client keeps its secrets (two X25519 private keys, the self-mask seed, the shares it
holds for its neighbours) in memory for the round only. It checks every server message
against the public graph and refuses any unmask request that would let the server learn
both secrets of one peer (the peer's self-mask seed and its mask-agreement key). A peer
whose advertised key is a low-order point (every shared secret with it all zeros) is
refused, not agreed with, and so is one whose relayed shares fail to decrypt (the client
holds none of its shares and says so in its masked input): either way the client carries
on with its other neighbours.
"""

from __future__ import annotations

import hashlib
import os
import struct

import numpy as np

from sporenet.federated.secagg import crypto, shamir
from sporenet.federated.secagg.encoding import FixedPointCodec
from sporenet.federated.secagg.errors import (
    DecryptionError,
    InvalidKeyError,
    ProtocolError,
    ThresholdError,
    UnmaskRefusedError,
)
from sporenet.federated.secagg.graph import neighbours_of
from sporenet.federated.secagg.messages import (
    AdvertiseKeys,
    KeysBroadcast,
    MaskedInput,
    RoundSetup,
    ShareKeys,
    SharesDelivery,
    UnmaskRequest,
    UnmaskResponse,
)
from sporenet.federated.secagg.prg import add_mask

_SHARE_HEADER = struct.Struct("<II")  # sender, recipient
_SHARE_PLAINTEXT_BYTES = _SHARE_HEADER.size + 2 * shamir.SHARE_BYTES


def self_mask_digest(round_id: bytes, client: int, seed: bytes) -> bytes:
    """The commitment to a self-mask seed that lets the server verify its reconstruction."""
    return hashlib.sha256(
        b"sporenet/secagg/v1/self-mask/" + round_id + client.to_bytes(4, "big") + seed
    ).digest()


def mask_sign(owner: int, peer: int) -> int:
    """+1 if `owner` adds the pairwise mask it shares with `peer`, -1 if it subtracts it."""
    return 1 if owner < peer else -1


class SecAggClient:
    """One client's state machine: advertise -> share -> masked input -> unmask."""

    def __init__(self, setup: RoundSetup, *, rng: np.random.Generator | None = None) -> None:
        p = setup.params
        if not 0 <= setup.client < p.num_clients:
            raise ProtocolError(
                f"client index must be in [0, {p.num_clients}), found {setup.client}"
            )
        if setup.vector_length < 1:
            raise ProtocolError(f"vector_length must be >= 1, found {setup.vector_length}")
        self.setup = setup
        self.index = setup.client
        self.params = p
        self.neighbours = frozenset(
            neighbours_of(self.index, p.num_clients, p.num_neighbours, setup.graph_seed)
        )
        self._codec = FixedPointCodec(p)
        self._rng = rng if rng is not None else np.random.default_rng()
        self._enc_key = crypto.generate_private_key()
        self._mask_key = crypto.generate_private_key()
        self._step = "advertise"
        self._peer_keys: dict[int, tuple[bytes, bytes]] = {}
        self._channel_keys: dict[int, bytes] = {}
        self._self_mask_seed = b""
        # sender -> (share of its mask-agreement key, share of its self-mask seed)
        self._held: dict[int, tuple[bytes, bytes]] = {}
        self._revealed_key: set[int] = set()
        self._revealed_self_mask: set[int] = set()
        #: Peers refused for an invalid public key or undecryptable shares (peer -> why).
        self.refused_peers: dict[int, str] = {}

    def _expect(self, step: str) -> None:
        if self._step != step:
            raise ProtocolError(
                f"client {self.index} expected the {step!r} step, is at {self._step!r}"
            )

    def advertise_keys(self) -> AdvertiseKeys:
        self._expect("advertise")
        self._step = "share"
        return AdvertiseKeys(
            self.index, crypto.public_bytes(self._enc_key), crypto.public_bytes(self._mask_key)
        )

    def share_keys(self, broadcast: KeysBroadcast) -> ShareKeys:
        """Secret-share the mask key and a fresh self-mask seed among advertised neighbours."""
        self._expect("share")
        peers = set(broadcast.keys)
        if not peers <= self.neighbours:
            raise ProtocolError(
                f"client {self.index} got keys of non-neighbours {sorted(peers - self.neighbours)}"
            )
        for peer in sorted(peers):
            for name, key in zip(("enc_public", "mask_public"), broadcast.keys[peer], strict=True):
                try:
                    crypto.check_public(key, f"client {peer}'s {name} key")
                except InvalidKeyError as e:
                    self.refused_peers.setdefault(peer, str(e))
        peers -= set(self.refused_peers)
        if len(peers) < self.params.threshold:
            raise ThresholdError(
                f"client {self.index}: {len(peers)} neighbours advertised valid keys, "
                f"threshold is {self.params.threshold}"
            )
        self._peer_keys = {v: broadcast.keys[v] for v in peers}
        rid = self.setup.round_id
        holders = sorted(peers)
        self._self_mask_seed = os.urandom(32)
        secrets = np.frombuffer(
            crypto.private_bytes(self._mask_key) + self._self_mask_seed, np.uint8
        ).reshape(2, 32)
        shares = shamir.share(secrets, np.asarray(holders) + 1, self.params.threshold)
        ciphertexts: dict[int, bytes] = {}
        for j, peer in enumerate(holders):
            key = crypto.agree(
                self._enc_key,
                self._peer_keys[peer][0],
                purpose=crypto.PURPOSE_ENCRYPTION,
                round_id=rid,
                a=self.index,
                b=peer,
            )
            self._channel_keys[peer] = key
            plaintext = (
                _SHARE_HEADER.pack(self.index, peer)
                + shamir.share_to_bytes(shares[0, j])
                + shamir.share_to_bytes(shares[1, j])
            )
            ciphertexts[peer] = crypto.encrypt(
                key, plaintext, round_id=rid, sender=self.index, recipient=peer
            )
        self._step = "masked_input"
        return ShareKeys(
            self.index, ciphertexts, self_mask_digest(rid, self.index, self._self_mask_seed)
        )

    def masked_input(self, delivery: SharesDelivery, update: np.ndarray) -> MaskedInput:
        """Store the neighbours' shares, then upload encode(update) + all masks."""
        self._expect("masked_input")
        senders = set(delivery.ciphertexts)
        refused = senders & set(self.refused_peers)
        if refused:
            raise ProtocolError(
                f"client {self.index} got shares from clients {sorted(refused)} whose keys it "
                "refused (low-order points)"
            )
        if not senders <= set(self._peer_keys):
            raise ProtocolError(
                f"client {self.index} got shares from clients "
                f"{sorted(senders - set(self._peer_keys))} that did not advertise"
            )
        if len(senders) < self.params.threshold:
            raise ThresholdError(
                f"client {self.index}: {len(senders)} neighbours shared keys, "
                f"threshold is {self.params.threshold}"
            )
        vector = np.asarray(update).reshape(-1)
        if vector.size != self.setup.vector_length:
            raise ProtocolError(
                f"update has {vector.size} values, the round expects {self.setup.vector_length}"
            )
        rid = self.setup.round_id
        undecryptable: list[int] = []
        for sender in sorted(senders):
            try:
                plain = crypto.decrypt(
                    self._channel_keys[sender],
                    delivery.ciphertexts[sender],
                    round_id=rid,
                    sender=sender,
                    recipient=self.index,
                )
                if len(plain) != _SHARE_PLAINTEXT_BYTES or _SHARE_HEADER.unpack_from(plain) != (
                    sender,
                    self.index,
                ):
                    raise DecryptionError(
                        f"share from client {sender} is malformed or misaddressed"
                    )
            except DecryptionError as e:
                # The sender is still masked with (its mask key is fine); only its shares
                # are refused, and the server hears so with the masked input.
                self.refused_peers[sender] = str(e)
                undecryptable.append(sender)
                continue
            body = plain[_SHARE_HEADER.size :]
            self._held[sender] = (body[: shamir.SHARE_BYTES], body[shamir.SHARE_BYTES :])
        y = self._codec.encode(vector, self._rng)
        add_mask(y, self._self_mask_seed, +1)
        for peer in sorted(senders):
            seed = crypto.agree(
                self._mask_key,
                self._peer_keys[peer][1],
                purpose=crypto.PURPOSE_MASK,
                round_id=rid,
                a=self.index,
                b=peer,
            )
            add_mask(y, seed, mask_sign(self.index, peer))
        self._step = "unmask"
        return MaskedInput(self.index, self._codec.reduce(y), tuple(undecryptable))

    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Reveal key shares of dropped peers and self-mask shares of surviving peers."""
        self._expect("unmask")
        dropped, survivors = set(request.dropped), set(request.survivors)
        if len(dropped) != len(request.dropped) or len(survivors) != len(request.survivors):
            raise ProtocolError(f"unmask request to client {self.index} repeats a peer")
        both = dropped & survivors
        if both:
            raise UnmaskRefusedError(
                f"client {self.index} refuses: peers {sorted(both)} are listed "
                "as both dropped and surviving"
            )
        unknown = (dropped | survivors) - set(self._held) - set(self.refused_peers)
        if unknown:
            raise ProtocolError(f"client {self.index} holds no shares of peers {sorted(unknown)}")
        conflict = (dropped & self._revealed_self_mask) | (survivors & self._revealed_key)
        if conflict:
            raise UnmaskRefusedError(
                f"client {self.index} refuses: the other secret of peers "
                f"{sorted(conflict)} was already revealed"
            )
        if len(survivors) + 1 < self.params.threshold:
            raise UnmaskRefusedError(
                f"client {self.index} refuses: only {len(survivors) + 1} clients of its "
                f"neighbourhood survived, threshold is {self.params.threshold}"
            )
        self._revealed_key |= dropped
        self._revealed_self_mask |= survivors
        return UnmaskResponse(
            self.index,
            {v: self._held[v][0] for v in sorted(dropped) if v in self._held},
            {v: self._held[v][1] for v in sorted(survivors) if v in self._held},
        )
