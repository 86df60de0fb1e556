"""The scheme tables: every scheme a policy accepts has one row, and each row's named parts exist.

The simulator, the deployment's server, nodes and launcher read a scheme's facts from these rows
(:mod:`fedrecgel_secure.privacy.secagg.schemes`, :mod:`fedrecgel_secure.deploy.schemes`) instead of comparing
its name; a scheme added to the policy without a row, or a row naming code that moved, fails here rather than
in the middle of a deployed round.
"""

from __future__ import annotations

import typing

import pytest

from fedrecgel_secure.deploy.schemes import DEPLOYED, setup_of
from fedrecgel_secure.policy import SecureAggregationPolicy, load_policy
from fedrecgel_secure.privacy.secagg.schemes import SCHEMES, part

POLICY_SCHEMES = typing.get_args(SecureAggregationPolicy.model_fields["scheme"].annotation)


def test_every_scheme_a_policy_accepts_has_one_row_in_each_table():
    assert set(POLICY_SCHEMES) == set(SCHEMES) == set(DEPLOYED)
    assert all(row.scheme is SCHEMES[name] for name, row in DEPLOYED.items())


@pytest.mark.parametrize("name", sorted(DEPLOYED))
def test_a_sealed_scheme_names_both_sides_of_its_protocol_and_an_unsealed_one_none(name):
    row = DEPLOYED[name]
    sides = [row.server_summer, row.node_role]
    if row.scheme.sealed:
        assert all(callable(part(s)) for s in sides)
        assert row.round_stages > 0 and row.scheme.params is not None
    else:
        assert sides == [None, None] and row.round_stages == 0 and row.scheme.params is None
        assert not row.scheme.key_holder  # no protocol, so no key to hold


@pytest.mark.parametrize("name", ["masking", "bfv", "dpf"])
def test_the_setup_carries_the_schemes_own_parameters(name):
    from fedrecgel_secure.privacy.secagg.bfv.params import BFVParams
    from fedrecgel_secure.privacy.secagg.dpf.params import DPFParams
    from fedrecgel_secure.privacy.secagg.masking.masks import MaskingParams

    policy = load_policy(None, [f"privacy.secure_aggregation.scheme={name}"])
    setup = setup_of(policy, 7, (3, 2))
    assert setup.dim == 7 and setup.min_clients == policy.privacy.secure_aggregation.min_clients
    assert isinstance(setup.params, {"masking": MaskingParams, "bfv": BFVParams, "dpf": DPFParams}[name])
    if name == "dpf":  # its keys address the item table's rows: the table's shape is in its parameters
        assert (setup.params.rows, setup.params.width) == (3, 2)
        with pytest.raises(ValueError, match="needs the table"):
            setup_of(policy, 7)


@pytest.mark.parametrize("name", ["masking", "bfv", "dpf"])
def test_a_sealed_schemes_server_side_offers_the_deployed_summers_interface(name):
    # the trainer drives every scheme's server side through these methods alone (no getattr for one scheme's)
    from fedrecgel_secure.deploy.server.summer import DeployedSummer

    policy = load_policy(None, [f"privacy.secure_aggregation.scheme={name}"])
    setup = setup_of(policy, 7, (3, 2))
    summer = part(DEPLOYED[name].server_summer)(setup, lambda stage, payloads: {}, None, {0: [0, 1]})
    assert isinstance(summer, DeployedSummer)


@pytest.mark.parametrize("name", sorted(DEPLOYED))
def test_a_scheme_with_a_key_holder_names_its_node_role_and_one_without_none(name):
    row = DEPLOYED[name]
    if row.scheme.key_holder:  # the key holder's node answers its stages through this role
        assert callable(part(row.key_holder_role)) and row.key_holder_state
    else:
        assert row.key_holder_role is None and row.key_holder_state == ()
