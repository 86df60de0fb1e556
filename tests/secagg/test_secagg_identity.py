"""Signed envelopes, key files and Shamir sharing: the building blocks of both schemes."""

import os
import secrets
import stat

import pytest

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.secagg import (
    ClientIdentity,
    Envelope,
    IdentityDirectory,
    KeyFileError,
    Kind,
    RejectedPayload,
    shamir,
)
from fedrecgel_secure.privacy.secagg.identity import HEADER, SIGNATURE_BYTES, open_envelope
from fedrecgel_secure.privacy.secagg.keys import read_private_file, write_private_file


@pytest.fixture(scope="module")
def alice():
    return ClientIdentity.generate(7)


@pytest.fixture(scope="module")
def directory(alice):
    return IdentityDirectory.of([alice, ClientIdentity.generate(8)])


def _open(data, directory, *, round_idx=3, completed=-1, context=b"tag"):
    return open_envelope(
        data, directory=directory, kind=Kind.HE_UPLOAD, round_idx=round_idx, completed_round=completed, context=context
    )


def test_envelope_layout_is_fixed_header_body_signature(alice):
    data = alice.seal(Kind.HE_UPLOAD, 3, b"hello", b"tag")
    assert len(data) == HEADER.size + 5 + SIGNATURE_BYTES == 24 + 5 + 64
    assert data[:4] == b"FRSA"
    env = Envelope.parse(data)
    assert (env.kind, env.round_idx, env.client_id, env.body) == (Kind.HE_UPLOAD, 3, 7, b"hello")
    assert env.to_bytes() == data


def test_valid_envelope_opens(alice, directory):
    assert _open(alice.seal(Kind.HE_UPLOAD, 3, b"x", b"tag"), directory).body == b"x"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda d: d[:50], "truncated"),
        (lambda d: d[:-1], "truncated"),
        (lambda d: d + b"\x00", "garbage"),
        (lambda d: b"XXXX" + d[4:], "garbage"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "bad_signature"),
        (lambda d: d[:24] + bytes([d[24] ^ 0x80]) + d[25:], "bad_signature"),
        (lambda d: d[:16] + (99).to_bytes(4, "big") + d[20:], "unknown_client"),
        (lambda d: d[:5] + bytes([Kind.MASK_INPUT]) + d[6:], "wrong_kind"),
    ],
    ids=["short", "cut", "trailing", "magic", "signature-bit", "body-bit", "unknown", "kind"],
)
def test_tampered_envelopes_are_rejected_with_a_reason(alice, directory, mutate, reason):
    data = alice.seal(Kind.HE_UPLOAD, 3, b"payload body", b"tag")
    with pytest.raises(RejectedPayload) as err:
        _open(mutate(data), directory)
    assert err.value.reason == reason
    assert isinstance(err.value, BadInputError)


def test_round_checks_distinguish_replay_from_wrong_round(alice, directory):
    old = alice.seal(Kind.HE_UPLOAD, 2, b"x", b"tag")
    with pytest.raises(RejectedPayload, match="replay"):
        _open(old, directory, round_idx=3, completed=2)
    future = alice.seal(Kind.HE_UPLOAD, 4, b"x", b"tag")
    with pytest.raises(RejectedPayload, match="wrong_round"):
        _open(future, directory, round_idx=3, completed=2)


def test_signature_binds_the_session_context(alice, directory):
    with pytest.raises(RejectedPayload, match="bad_signature"):
        _open(alice.seal(Kind.HE_UPLOAD, 3, b"x", b"other deployment"), directory)


def test_identity_key_file_is_owner_only(tmp_path, alice, directory):
    path = tmp_path / "alice.pem"
    alice.save(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded = ClientIdentity.load(7, path)
    assert loaded.public_bytes == alice.public_bytes
    os.chmod(path, 0o644)
    with pytest.raises(KeyFileError, match="0644"):
        ClientIdentity.load(7, path)


def test_rewriting_a_loose_file_tightens_it(tmp_path):
    path = tmp_path / "k"
    path.write_bytes(b"old")
    os.chmod(path, 0o666)
    write_private_file(path, b"new secret")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_private_file(path) == b"new secret"


def test_missing_or_malformed_key_files_are_clear_errors(tmp_path):
    with pytest.raises(KeyFileError, match="cannot open"):
        read_private_file(tmp_path / "absent")
    bad = tmp_path / "bad.pem"
    write_private_file(bad, b"not a key")
    with pytest.raises(KeyFileError, match="PEM"):
        ClientIdentity.load(1, bad)


def test_client_ids_must_fit_the_envelope():
    with pytest.raises(BadInputError):
        ClientIdentity.generate(2**32)


def test_shamir_any_threshold_shares_recover_the_secret():
    secret = secrets.token_bytes(32)
    shares = shamir.split(secret, range(1, 8), threshold=4)
    assert shamir.combine({x: shares[x] for x in (2, 5, 6, 7)}, 4) == secret
    assert shamir.combine(shares, 4) == secret
    with pytest.raises(BadInputError):
        shamir.combine({x: shares[x] for x in (1, 2, 3)}, 4)


def test_shamir_fewer_shares_do_not_pin_the_secret():
    # Three shares of a threshold-4 secret are consistent with any other secret:
    # adding a fourth point chosen freely interpolates to a different value.
    secret = secrets.token_bytes(32)
    shares = shamir.split(secret, [1, 2, 3, 4], threshold=4)
    forged = dict(shares)
    forged[4] = (forged[4] + 1) % shamir.PRIME
    try:
        other = shamir.combine(forged, 4)
    except BadInputError:
        other = None
    assert other != secret


def test_shamir_share_bytes_round_trip_and_range_check():
    y = secrets.randbelow(shamir.PRIME)
    assert shamir.share_from_bytes(shamir.share_to_bytes(y)) == y
    with pytest.raises(BadInputError):
        shamir.share_from_bytes(b"\xff" * shamir.SHARE_BYTES)
