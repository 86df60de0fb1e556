"""Every deserialiser, fed random bytes or mutations of valid payloads, raises only our error types."""

import contextlib
import dataclasses
import functools
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.secagg import (
    BFVAggregator,
    BFVClient,
    BFVParams,
    ClientIdentity,
    Envelope,
    FixedPoint,
    IdentityDirectory,
    KeyHolder,
    Kind,
    MaskingAggregator,
    MaskingClient,
    MaskingParams,
    RejectedPayload,
    ServerIdentity,
)
from fedrecgel_secure.privacy.secagg.bfv import wire as bfv_wire
from fedrecgel_secure.privacy.secagg.masking import masks as masking
from fedrecgel_secure.privacy.secagg.masking import wire as masking_wire

DIM = 100
TAG = b"fuzz-session-tag-0123"
# SECAGG_FUZZ_EXAMPLES raises the budget for a longer, offline fuzzing run.
FUZZ = settings(
    max_examples=int(os.environ.get("SECAGG_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def mutation_of(draw, valid: bytes):
    """Bit flips (biased to headers), truncation, insertion, overwrite or a random tail."""
    data = bytearray(valid)
    op = draw(st.sampled_from(["flip", "truncate", "insert", "overwrite", "tail"]))
    pos = draw(st.one_of(st.integers(0, min(len(data), 80) - 1), st.integers(0, len(data) - 1)))
    if op == "flip":
        for _ in range(draw(st.integers(1, 4))):
            data[pos] ^= 1 << draw(st.integers(0, 7))
            pos = draw(st.integers(0, len(data) - 1))
    elif op == "truncate":
        del data[pos:]
    elif op == "insert":
        data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
    elif op == "overwrite":
        chunk = draw(st.binary(min_size=1, max_size=8))
        data[pos : pos + len(chunk)] = chunk
    else:
        data[pos:] = draw(st.binary(max_size=64))
    return bytes(data)


def bytes_or_mutation(valid: bytes):
    return st.one_of(st.binary(max_size=512), mutation_of(valid))


@functools.cache
def he_world():
    ids = {c: ClientIdentity.generate(c) for c in range(3)}
    directory = IdentityDirectory.of(ids)
    holder = KeyHolder.create(BFVParams(), directory, dim=DIM, min_clients=2, session_tag=TAG)
    public = holder.public_context()
    clients = {
        c: BFVClient(ids[c], public, DIM, encoding=FixedPoint(), session_tag=TAG, tag_key=holder.client_key(c))
        for c in ids
    }
    uploads = {c: clients[c].upload(0, np.full(DIM, 0.1 * c)) for c in ids}
    agg = BFVAggregator(public, directory, DIM, min_clients=2, session_tag=TAG)
    agg.begin_round(0)
    for c in (0, 1):
        agg.receive(uploads[c])
    aggregate = agg.finish().serialize()
    agg.begin_round(1)
    return {
        "holder": holder,
        "directory": directory,
        "public": public,
        "uploads": uploads,
        "aggregate": aggregate,
        "agg": agg,
    }


@functools.cache
def masking_world():
    n = 4
    params = MaskingParams()
    ids = {c: ClientIdentity.generate(c) for c in range(n)}
    directory = IdentityDirectory.of(ids)
    server = ServerIdentity.generate()
    grid = FixedPoint()
    clients = {
        c: MaskingClient(
            ids[c],
            directory,
            DIM,
            params,
            server_key=server.public_bytes,
            encoding=grid,
            min_clients=2,
            session_tag=TAG,
        )
        for c in ids
    }
    agg = MaskingAggregator(directory, DIM, params, identity=server, encoding=grid, min_clients=2, session_tag=TAG)
    announcement = agg.begin_round(0)
    adverts = {c: clients[c].advertise(announcement) for c in ids}
    for p in adverts.values():
        agg.receive(p)
    broadcast = agg.close_adverts()
    shares = {c: clients[c].share_keys(broadcast) for c in ids}
    for p in shares.values():
        agg.receive(p)
    inboxes = agg.close_shares()
    masked = {c: clients[c].masked_input(inboxes[c], np.zeros(DIM)) for c in ids}
    for c in (0, 1, 2):
        agg.receive(masked[c])
    # The aggregator stays in the upload step so that receive() is fuzzed there; the
    # later server messages are signed by hand with its key.
    ctx = masking._context(TAG, agg._round.round_seed)
    check = server.seal(Kind.MASK_CHECK, 0, masking_wire.encode_survivors(0, list(ids)), ctx)
    confirms = {c: Envelope.parse(clients[c].confirm(check)) for c in ids}
    request = server.seal(
        Kind.MASK_REQUEST,
        0,
        masking_wire.encode_request(0, list(ids), {c: e.signature for c, e in confirms.items()}),
        ctx,
    )
    unmask = clients[0].unmask(request)
    return {
        "announcement": announcement,
        "broadcast": broadcast,
        "inbox": inboxes[3],
        "check": check,
        "request": request,
        "shares": Envelope.parse(shares[0]).body,
        "unmask": Envelope.parse(unmask).body,
        "masked": masked[3],
        "clients": clients,
        "agg": agg,
    }


def body(payload):
    return bytes(Envelope.parse(payload).body)


def only_rejections(fn, *args):
    with contextlib.suppress(RejectedPayload):
        fn(*args)


def only_bad_input(fn, *args):
    with contextlib.suppress(BadInputError):
        fn(*args)


@FUZZ
@given(st.data())
def test_envelope_parser(data):
    only_rejections(Envelope.parse, data.draw(bytes_or_mutation(he_world()["uploads"][2])))


@FUZZ
@given(st.data())
def test_he_upload_body_decoder(data):
    w = he_world()
    body = Envelope.parse(w["uploads"][2]).body
    agg = w["agg"]
    only_rejections(bfv_wire.decode_upload, data.draw(bytes_or_mutation(body)), agg.context, agg.params, DIM)


@FUZZ
@given(st.data())
def test_he_aggregator_receive(data):
    w = he_world()
    only_rejections(w["agg"].receive, data.draw(bytes_or_mutation(w["uploads"][2])))


@FUZZ
@given(st.data())
def test_he_key_holder_decrypt(data):
    w = he_world()
    fresh = KeyHolder(
        w["holder"]._ctx, w["directory"], dim=DIM, min_clients=2, session_tag=TAG, tag_keys=w["holder"]._tags
    )
    only_rejections(fresh.decrypt, data.draw(bytes_or_mutation(w["aggregate"])))


@FUZZ
@given(st.data())
def test_masking_aggregator_messages(data):
    w = masking_world()
    only_rejections(Envelope.parse, data.draw(bytes_or_mutation(w["request"])))
    only_rejections(masking_wire.decode_announcement, data.draw(bytes_or_mutation(body(w["announcement"]))))
    only_rejections(masking_wire.decode_survivors, data.draw(bytes_or_mutation(body(w["check"]))), 0)
    only_rejections(masking_wire.decode_request, data.draw(bytes_or_mutation(body(w["request"]))), 0)
    only_rejections(masking_wire.decode_inbox, data.draw(bytes_or_mutation(body(w["inbox"]))), 0)
    seed = body(w["announcement"])[-16:]
    only_rejections(masking_wire.decode_adverts, data.draw(bytes_or_mutation(body(w["broadcast"]))), 0, seed)


@FUZZ
@given(st.data())
def test_masking_client_bodies(data):
    w = masking_world()
    only_rejections(masking_wire.decode_share_bundle, data.draw(bytes_or_mutation(w["shares"])))
    only_rejections(masking_wire.decode_unmask, data.draw(bytes_or_mutation(w["unmask"])))
    only_rejections(masking_wire.decode_masked, data.draw(bytes_or_mutation(w["masked"][24:-64])), DIM)


@FUZZ
@given(st.data())
def test_masking_aggregator_receive(data):
    w = masking_world()
    only_rejections(w["agg"].receive, data.draw(bytes_or_mutation(w["masked"])))


def from_state(client, state, fn, *args):
    """Run one client step from a copy of a saved state: a refused message aborts the client's attempt."""
    client._round = state
    with contextlib.suppress(BadInputError):
        fn(*args)


@FUZZ
@given(st.data())
def test_masking_client_steps_reject_bad_aggregator_messages(data):
    w = masking_world()
    client = w["clients"][3]
    saved = client.__dict__.setdefault("_fuzz_saved", client._round)
    fresh = dataclasses.replace(saved, cohort=(), c_shared={}, s_shared={}, held={}, survivors=None)
    from_state(client, fresh, client.share_keys, data.draw(bytes_or_mutation(w["broadcast"])))
    fresh = dataclasses.replace(saved, held={}, survivors=None)
    from_state(client, fresh, client.masked_input, data.draw(bytes_or_mutation(w["inbox"])), np.zeros(DIM))
    from_state(
        client, dataclasses.replace(saved, survivors=None), client.confirm, data.draw(bytes_or_mutation(w["check"]))
    )
    from_state(client, dataclasses.replace(saved), client.unmask, data.draw(bytes_or_mutation(w["request"])))
    client._round = saved
