"""Attack: a malicious aggregator tries to learn one chosen client's exact upload from pairwise masking.

The attacker is the server: it holds the server's signing key, so its messages
verify, and it may send any bytes to any client in any order. The clients are
the real :class:`MaskingClient` objects, driven with bytes only. Each test
plays one attack from issue #10 (finding 3) and asserts that the clients
refuse (``ProtocolViolation`` with its reason, the attempt forgotten) and that
what the server collected does not give x_victim.

Before the fix (commit 2891f77), each of these recovered x_victim to about
7e-12 (empty or truncated inbox, false survivor list, cohort of 2, split view
with t = 4 of 9), a client answered a survivor list that left it out or was
padded with ids outside the cohort, server messages were unsigned, and an
all-zero X25519 advert made every client's share_keys raise ValueError.
"""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.privacy.secagg import (
    ClientIdentity,
    Envelope,
    FixedPoint,
    IdentityDirectory,
    Kind,
    MaskingAggregator,
    MaskingClient,
    MaskingParams,
    ProtocolViolation,
    RejectedPayload,
    ServerIdentity,
    shamir,
)
from fedrecgel_secure.privacy.secagg.masking.masks import _context, _pair_seed, _self_seed, prg_into
from fedrecgel_secure.privacy.secagg.masking.wire import (
    decode_share_bundle,
    decode_unmask,
    encode_adverts,
    encode_announcement,
    encode_inbox,
    encode_request,
    encode_survivors,
)

DIM, N, MIN_CLIENTS, V = 1000, 10, 5, 0
TAG = b"malicious-server-attack-tag"
GRID = FixedPoint()
LOW_ORDER = bytes.fromhex("e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800")  # order 8


class Server:
    """A malicious aggregator: the real one for bookkeeping, plus the key to sign whatever it likes."""

    def __init__(self, params=MaskingParams(degree="all"), n=N):
        self.params = params
        self.ids = {c: ClientIdentity.generate(c) for c in range(n)}
        self.directory = IdentityDirectory.of(self.ids)
        self.key = ServerIdentity.generate()
        self.clients = {
            c: MaskingClient(
                self.ids[c],
                self.directory,
                DIM,
                params,
                server_key=self.key.public_bytes,
                encoding=GRID,
                min_clients=MIN_CLIENTS,
                session_tag=TAG,
            )
            for c in self.ids
        }
        self.agg = MaskingAggregator(
            self.directory, DIM, params, identity=self.key, encoding=GRID, min_clients=MIN_CLIENTS, session_tag=TAG
        )
        self.xs = {c: np.random.default_rng(c).normal(0.0, 0.1, DIM) for c in self.ids}
        self.shares: dict[tuple[int, int], dict[int, int]] = {}
        self.masked: dict[int, bytes] = {}
        self.partners: dict[int, list[int]] = {}
        self.known_s: dict[int, bytes] = {}  # s-keys handed over by colluding clients

    def sign(self, kind, body):
        return self.key.seal(kind, 0, body, _context(TAG, self.seed))

    def announce(self):
        ann = self.agg.begin_round(0)
        self.seed = self.agg._round.round_seed
        self.adverts = {c: self.clients[c].advertise(ann) for c in self.clients}
        for p in self.adverts.values():
            self.agg.receive(p)
        return self.agg.close_adverts()

    def share(self, members=None):
        """Honest key exchange; returns the honest inboxes."""
        broadcast = self.announce()
        for c in members or self.clients:
            self.agg.receive(self.clients[c].share_keys(broadcast))
        return self.agg.close_shares()

    def inbox(self, c, senders):
        bundles = self.agg._round.bundles
        return self.sign(Kind.MASK_INBOX, encode_inbox(0, c, [(s, bundles[s][c]) for s in senders]))

    def upload_all(self, inboxes):
        bundles = self.agg._round.bundles
        for c, inbox in inboxes.items():
            self.masked[c] = self.clients[c].masked_input(inbox, self.xs[c])
            self.partners[c] = sorted(s for s in bundles if c in bundles[s])

    def check(self, survivors):
        return self.sign(Kind.MASK_CHECK, encode_survivors(0, survivors))

    def collect(self, payload):
        env = Envelope.parse(payload)
        for owner, (kind, y) in decode_unmask(env.body).items():
            self.shares.setdefault((owner, kind), {})[env.client_id + 1] = y

    def estimate(self, victim=V):
        """The server's best reconstruction of x_victim from what it holds, or None if it lacks a secret."""
        if victim not in self.masked:
            return None
        t = self.params.threshold_for(self.params.neighbour_count(len(self.clients)))
        keys = {c: Envelope.parse(a).body for c, a in self.adverts.items()}
        y = np.frombuffer(Envelope.parse(self.masked[victim]).body, dtype="<u8").astype(np.uint64)
        mask = np.empty_like(y)
        b_shares = self.shares.get((victim, 0), {})
        if len(b_shares) < t:
            return None
        y -= prg_into(_self_seed(shamir.combine(b_shares, t), self.seed, 0, victim), mask)
        for j in self.partners[victim]:
            s_shares = self.shares.get((j, 1), {})
            if j in self.known_s:
                s_j = X25519PrivateKey.from_private_bytes(self.known_s[j])
            elif len(s_shares) >= t:
                s_j = X25519PrivateKey.from_private_bytes(shamir.combine(s_shares, t))
            else:
                return None
            shared = s_j.exchange(X25519PublicKey.from_public_bytes(bytes(keys[victim][32:])))
            prg_into(_pair_seed(shared, self.seed, 0, victim, j), mask)
            y = y - mask if victim < j else y + mask
        return GRID.decode(y.view(np.int64))

    def assert_victim_safe(self, victim=V):
        est = self.estimate(victim)
        assert est is None or np.abs(est - self.xs[victim]).max() > 1.0


def refused(fn, *args, reason):
    with pytest.raises(ProtocolViolation) as err:
        fn(*args)
    assert err.value.reason == reason, err.value
    return err.value


def test_an_empty_inbox_is_refused_and_the_round_still_completes_for_the_others():
    s = Server()
    inboxes = s.share()
    inboxes[V] = s.inbox(V, [])
    refused(s.clients[V].masked_input, inboxes[V], s.xs[V], reason="too_few_shares")
    assert s.clients[V]._round is None  # the attempt's secrets are gone: nothing more can be released
    del inboxes[V]
    s.upload_all(inboxes)
    for p in s.masked.values():
        s.agg.receive(p)
    check = s.agg.close_masked()
    for c in inboxes:
        s.agg.receive(s.clients[c].confirm(check))
    request = s.agg.close_confirms()
    for c in inboxes:
        payload = s.clients[c].unmask(request)
        s.agg.receive(payload)
        s.collect(payload)
    out = s.agg.finish()
    assert out.contributors == list(range(1, N))
    assert np.abs(out.values - sum(s.xs[c] for c in range(1, N))).max() <= GRID.error_bound(N)
    s.assert_victim_safe()  # the victim uploaded nothing


def test_a_truncated_inbox_with_fewer_than_t_shares_is_refused():
    s = Server()
    s.share()
    t = s.params.threshold_for(N - 1)
    refused(s.clients[V].masked_input, s.inbox(V, list(range(1, t))), s.xs[V], reason="too_few_shares")
    s.assert_victim_safe()


def test_neighbours_declared_dropped_but_asked_to_unmask_are_refused():
    """U3 = the victim and 4 others: every neighbour outside U3 refuses, and so does everyone in it."""
    s = Server()
    s.upload_all(s.share())
    check = s.check([V, 1, 2, 3, 4])  # t = 5: the victim would keep only 4 partners
    refused(s.clients[V].confirm, check, reason="too_few_shares")
    for c in (1, 2, 3, 4):
        refused(s.clients[c].confirm, check, reason="too_few_shares")
    for c in range(5, N):
        refused(s.clients[c].confirm, check, reason="not_a_survivor")
    # Skipping the consistency step does not help: no client answers an unmask request it did not confirm.
    for c in range(5, N):
        with pytest.raises(BadInputError):
            s.clients[c].unmask(s.sign(Kind.MASK_REQUEST, encode_request(0, [V, 1, 2, 3, 4], {})))
    s.assert_victim_safe()


def test_a_survivor_set_that_leaves_the_victim_out_is_refused_by_it_and_gives_no_b_share():
    s = Server()
    s.upload_all(s.share())
    others = list(range(1, N))
    check = s.check(others)
    refused(s.clients[V].confirm, check, reason="not_a_survivor")
    confirms = {c: Envelope.parse(s.clients[c].confirm(check)).signature for c in others}
    request = s.sign(Kind.MASK_REQUEST, encode_request(0, others, confirms))
    for c in others:
        s.collect(s.clients[c].unmask(request))
    # The victim counts as dropped: its s-key is out, its b-seed (the self mask on its upload) is not.
    assert len(s.shares[(V, 1)]) == N - 1 and (V, 0) not in s.shares
    s.assert_victim_safe()


def test_survivor_ids_outside_the_cohort_are_refused():
    s = Server()
    s.upload_all(s.share())
    check = s.check([V, 1000, 1001, 1002, 1003])  # padding to min_clients with strangers
    for c in s.clients:
        with pytest.raises(ProtocolViolation) as err:
            s.clients[c].confirm(check)
        assert err.value.reason in ("not_in_cohort", "not_a_survivor")
    s.assert_victim_safe()


def test_a_cohort_shrunk_below_min_clients_or_padded_with_strangers_is_refused():
    s = Server()
    s.announce()
    two = encode_adverts(0, s.seed, [s.adverts[V], s.adverts[1]])  # k = 1, t = 1: the shares would be the secrets
    refused(s.clients[V].share_keys, s.sign(Kind.MASK_COHORT, two), reason="too_few_contributors")
    refused(s.clients[1].share_keys, s.sign(Kind.MASK_COHORT, two), reason="too_few_contributors")
    stranger = ClientIdentity.generate(77).seal(
        Kind.MASK_ADVERTISE, 0, bytes(Envelope.parse(s.adverts[2]).body), _context(TAG, s.seed)
    )
    padded = encode_adverts(0, s.seed, [s.adverts[c] for c in (2, 3, 4, 5)] + [stranger])
    refused(s.clients[2].share_keys, s.sign(Kind.MASK_COHORT, padded), reason="unknown_client")
    without = encode_adverts(0, s.seed, [s.adverts[c] for c in range(4, N)])
    refused(s.clients[3].share_keys, s.sign(Kind.MASK_COHORT, without), reason="not_in_cohort")


def test_unsigned_forged_or_misdirected_server_messages_are_refused():
    s = Server()
    client = s.clients[V]
    raw = encode_announcement(0, b"\x07" * 16)
    refused(client.advertise, raw, reason="truncated")  # the old unsigned format
    impostor = ServerIdentity.generate().seal(Kind.MASK_ANNOUNCE, 0, raw, _context(TAG, b"\x07" * 16))
    refused(client.advertise, impostor, reason="bad_signature")
    # Client 0 signing as "sender 0" does not pass for the server: the domains differ.
    as_client = s.ids[0].seal(Kind.MASK_ANNOUNCE, 0, raw, _context(TAG, b"\x07" * 16))
    refused(client.advertise, as_client, reason="bad_signature")
    other_tag = s.key.seal(Kind.MASK_ANNOUNCE, 0, raw, _context(b"another-deployment-tag", b"\x07" * 16))
    refused(client.advertise, other_tag, reason="bad_signature")
    inboxes = s.share()
    refused(s.clients[1].masked_input, inboxes[2], s.xs[1], reason="not_in_cohort")  # someone else's inbox
    refused(
        s.clients[3].masked_input,
        s.sign(Kind.MASK_CHECK, bytes(Envelope.parse(inboxes[3]).body)),
        s.xs[3],
        reason="wrong_kind",
    )


def test_a_split_view_of_the_survivors_fails_the_consistency_check():
    """t = 4 of 9 neighbours: half are told the victim survived (b-shares), half that it dropped (s-shares).

    Without the consistency check that recovers x_victim; with it, each view has 5 of
    the T = 7 signatures it needs, and no client releases a share.
    """
    s = Server(MaskingParams(degree="all", threshold=4))
    s.upload_all(s.share())
    with_v, without_v = list(range(N)), list(range(1, N))
    group_a, group_b = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]
    sigs = {c: Envelope.parse(s.clients[c].confirm(s.check(with_v))).signature for c in group_a}
    sigs |= {c: Envelope.parse(s.clients[c].confirm(s.check(without_v))).signature for c in group_b}
    for c in group_a:
        refused(s.clients[c].unmask, s.sign(Kind.MASK_REQUEST, encode_request(0, with_v, sigs)), reason="inconsistent")
    for c in group_b:
        refused(
            s.clients[c].unmask, s.sign(Kind.MASK_REQUEST, encode_request(0, without_v, sigs)), reason="inconsistent"
        )
    assert s.shares == {}
    s.assert_victim_safe()


def test_a_client_shares_uploads_and_signs_once_per_attempt_and_refuses_a_retry_after_signing():
    s = Server()
    inboxes = s.share()
    cohort = s.sign(Kind.MASK_COHORT, encode_adverts(0, s.seed, [s.adverts[c] for c in range(N)]))
    refused(s.clients[9].share_keys, cohort, reason="already_answered")  # a second, independent sharing
    del inboxes[9]
    s.upload_all(inboxes)
    refused(s.clients[8].masked_input, inboxes[8], s.xs[8], reason="already_answered")  # a second upload
    everyone = list(range(8))
    s.clients[V].confirm(s.check(everyone))
    refused(s.clients[V].confirm, s.check(everyone[:-1]), reason="already_answered")
    s.clients[1].confirm(s.check(everyone))
    retry = s.agg.begin_round(0)  # a new attempt of round 0 would sum the same inputs again
    refused(s.clients[1].advertise, retry, reason="already_answered")
    refused(s.clients[V].advertise, retry, reason="already_answered")
    s.clients[2].advertise(retry)  # a client that signed nothing in round 0 may take part in the retry


@pytest.mark.parametrize("key", [bytes(32), LOW_ORDER], ids=["all-zero", "low-order"])
def test_a_zero_or_low_order_key_advert_is_rejected_and_the_round_completes(key):
    s = Server()
    ann = s.agg.begin_round(0)
    seed = s.agg._round.round_seed
    for c in s.clients:
        if c == 5:
            good = s.clients[5].advertise(ann)
            bad = s.ids[5].seal(
                Kind.MASK_ADVERTISE, 0, bytes(Envelope.parse(good).body)[:32] + key, _context(TAG, seed)
            )
            with pytest.raises(RejectedPayload) as err:
                s.agg.receive(bad)
            assert err.value.reason == "bad_key"
        else:
            s.agg.receive(s.clients[c].advertise(ann))
    broadcast = s.agg.close_adverts()
    members = [c for c in s.clients if c != 5]
    for c in members:
        s.agg.receive(s.clients[c].share_keys(broadcast))
    inboxes = s.agg.close_shares()
    for c in members:
        s.agg.receive(s.clients[c].masked_input(inboxes[c], s.xs[c]))
    check = s.agg.close_masked()
    for c in members:
        s.agg.receive(s.clients[c].confirm(check))
    request = s.agg.close_confirms()
    for c in members:
        s.agg.receive(s.clients[c].unmask(request))
    out = s.agg.finish()
    assert out.contributors == members
    assert np.abs(out.values - sum(s.xs[c] for c in members)).max() <= GRID.error_bound(N)


def test_a_zero_key_in_a_cohort_broadcast_makes_the_clients_ignore_that_neighbour_not_crash():
    s = Server()
    s.announce()
    bad = s.ids[5].seal(Kind.MASK_ADVERTISE, 0, bytes(64), _context(TAG, s.seed))
    cohort = encode_adverts(0, s.seed, [s.adverts[c] if c != 5 else bad for c in range(N)])
    bundle = decode_share_bundle(Envelope.parse(s.clients[V].share_keys(s.sign(Kind.MASK_COHORT, cohort))).body)
    assert 5 not in bundle and len(bundle) == N - 2


@pytest.mark.parametrize("colluders", [4, 5], ids=["t-1 colluders", "t colluders"])
def test_control_the_reconstruction_works_once_t_neighbours_collude(colluders):
    """Guarantee (a)/(c): an honest round plus c_v colluding partners; x_victim is exposed iff c_v >= t (t = 5 here).

    This also checks that ``Server.estimate`` would catch a successful attack in the tests above.
    """
    s = Server()
    s.upload_all(s.share())
    for p in s.masked.values():
        s.agg.receive(p)
    check = s.agg.close_masked()
    for c in s.clients:
        s.agg.receive(s.clients[c].confirm(check))
    request = s.agg.close_confirms()
    gang = list(range(1, 1 + colluders))
    for c in gang:  # colluders hand over their own s-keys and their shares of everyone else's
        st = s.clients[c]._round
        s.known_s[c] = st.s_key.private_bytes_raw()
        for owner, (_, s_share) in st.held.items():
            s.shares.setdefault((owner, 1), {})[c + 1] = s_share
    for c in s.clients:
        s.collect(s.clients[c].unmask(request))  # the honest answer: b-shares of all (everyone survived)
    est = s.estimate()
    if colluders >= s.params.threshold_for(N - 1):
        assert np.abs(est - s.xs[V]).max() <= GRID.error_bound(1)
    else:
        assert est is None


def test_a_holder_shown_another_cohort_cannot_open_the_victims_shares():
    """Two cohort views give two consistency domains; the shares are bound to the sender's view.

    Otherwise holders in a second view could confirm "victim dropped" among
    themselves (s-shares) while the first view confirms "victim survived"
    (b-shares), and each view's T signatures would come from its own members.
    """
    s = Server(MaskingParams(degree="all", threshold=4))
    broadcast = s.announce()
    other_view = s.sign(Kind.MASK_COHORT, encode_adverts(0, s.seed, [s.adverts[c] for c in range(N - 1)]))
    for c in range(N):
        s.agg.receive(s.clients[c].share_keys(other_view if c == 5 else broadcast))
    bundles = s.agg._round.bundles
    inbox = s.sign(Kind.MASK_INBOX, encode_inbox(0, 5, [(j, bundles[j][5]) for j in range(N - 1) if j != 5]))
    refused(s.clients[5].masked_input, inbox, s.xs[5], reason="bad_share")


def test_a_survivor_kept_out_of_the_consistency_check_has_no_b_share_revealed():
    """The server lists the victim in U3 but never asks it to confirm, so the victim never checks its partners.

    Holders reveal a b-share only for partners whose own signature on U3 they
    verified, so the victim's self mask stays on: its upload is left out of any sum.
    """
    s = Server()
    s.upload_all(s.share())
    everyone = list(range(N))
    check = s.check(everyone)
    sigs = {c: Envelope.parse(s.clients[c].confirm(check)).signature for c in range(1, N)}
    request = s.sign(Kind.MASK_REQUEST, encode_request(0, everyone, sigs))
    for c in range(1, N):
        s.collect(s.clients[c].unmask(request))
    assert (V, 0) not in s.shares and (V, 1) not in s.shares
    assert all(len(s.shares[(c, 0)]) == N - 2 for c in range(1, N))
    s.assert_victim_safe()
