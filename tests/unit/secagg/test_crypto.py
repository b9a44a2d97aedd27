"""Key agreement, share encryption and mask expansion: round trips and tamper detection."""

import numpy as np
import pytest

from sporenet.federated.secagg import crypto, prg
from sporenet.federated.secagg.errors import DecryptionError, ProtocolError

RID = b"r" * 16


def test_agreement_is_symmetric_and_bound_to_purpose_round_and_pair() -> None:
    a, b = crypto.generate_private_key(), crypto.generate_private_key()
    ab = crypto.agree(
        a, crypto.public_bytes(b), purpose=crypto.PURPOSE_MASK, round_id=RID, a=1, b=2
    )
    ba = crypto.agree(
        b, crypto.public_bytes(a), purpose=crypto.PURPOSE_MASK, round_id=RID, a=2, b=1
    )
    assert ab == ba and len(ab) == 32
    other = {
        crypto.agree(
            a, crypto.public_bytes(b), purpose=crypto.PURPOSE_ENCRYPTION, round_id=RID, a=1, b=2
        ),
        crypto.agree(
            a, crypto.public_bytes(b), purpose=crypto.PURPOSE_MASK, round_id=b"s" * 16, a=1, b=2
        ),
        crypto.agree(
            a, crypto.public_bytes(b), purpose=crypto.PURPOSE_MASK, round_id=RID, a=1, b=3
        ),
    }
    assert ab not in other and len(other) == 3


def test_low_order_public_key_is_rejected() -> None:
    with pytest.raises(ProtocolError, match="low-order"):
        crypto.agree(
            crypto.generate_private_key(),
            bytes(32),
            purpose=crypto.PURPOSE_MASK,
            round_id=RID,
            a=1,
            b=2,
        )
    with pytest.raises(ProtocolError, match="32 bytes"):
        crypto.load_public(b"short")


def test_private_key_round_trip() -> None:
    k = crypto.generate_private_key()
    assert crypto.public_bytes(crypto.load_private(crypto.private_bytes(k))) == crypto.public_bytes(
        k
    )


def test_encrypt_decrypt_round_trip() -> None:
    key = bytes(range(32))
    ct = crypto.encrypt(key, b"share payload", round_id=RID, sender=3, recipient=4)
    assert b"share payload" not in ct
    assert crypto.decrypt(key, ct, round_id=RID, sender=3, recipient=4) == b"share payload"


@pytest.mark.parametrize("position", [0, 12, -1])
def test_any_flipped_bit_is_detected(position: int) -> None:
    key = bytes(range(32))
    ct = bytearray(crypto.encrypt(key, b"share payload", round_id=RID, sender=3, recipient=4))
    ct[position] ^= 0x01
    with pytest.raises(DecryptionError, match="failed authentication"):
        crypto.decrypt(key, bytes(ct), round_id=RID, sender=3, recipient=4)


def test_misrouted_or_replayed_ciphertext_is_detected() -> None:
    key = bytes(range(32))
    ct = crypto.encrypt(key, b"x", round_id=RID, sender=3, recipient=4)
    with pytest.raises(DecryptionError):
        crypto.decrypt(key, ct, round_id=RID, sender=3, recipient=5)
    with pytest.raises(DecryptionError):
        crypto.decrypt(key, ct, round_id=b"s" * 16, sender=3, recipient=4)
    with pytest.raises(DecryptionError, match="truncated"):
        crypto.decrypt(key, ct[:10], round_id=RID, sender=3, recipient=4)


def test_mask_expansion_is_deterministic_and_seed_dependent() -> None:
    s1, s2 = bytes(32), bytes(31) + b"\x01"
    m1 = prg.expand(s1, 1000, np.dtype(np.uint32))
    np.testing.assert_array_equal(m1, prg.expand(s1, 1000, np.dtype(np.uint32)))
    assert np.mean(m1 == prg.expand(s2, 1000, np.dtype(np.uint32))) < 0.01
    m64 = prg.expand(s1, 500, np.dtype(np.uint64))
    assert m64.dtype == np.uint64 and m64.size == 500
    # A prefix of a longer stream: masks of different lengths from one seed are consistent.
    np.testing.assert_array_equal(prg.expand(s1, 10, np.dtype(np.uint32)), m1[:10])
    with pytest.raises(ProtocolError, match="32 bytes"):
        prg.expand(b"short", 10, np.dtype(np.uint32))


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_added_and_subtracted_masks_cancel_with_wraparound(dtype) -> None:
    acc = np.arange(100, dtype=dtype)
    prg.add_mask(acc, b"a" * 32, +1)
    prg.add_mask(acc, b"b" * 32, -1)
    assert not np.array_equal(acc, np.arange(100, dtype=dtype))
    prg.add_mask(acc, b"a" * 32, -1)
    prg.add_mask(acc, b"b" * 32, +1)
    np.testing.assert_array_equal(acc, np.arange(100, dtype=dtype))
