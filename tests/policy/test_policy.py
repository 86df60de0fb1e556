"""Policy files: strict, closed, and every error names the file and the dotted field."""

from __future__ import annotations

import json
import typing

import pytest
from pydantic import BaseModel

from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import POLICY_DIR, Policy, load_policy
from fedrecgel_secure.privacy.secagg.settings import bfv_params

SHIPPED = sorted(POLICY_DIR.glob("*.toml"))


def test_every_shipped_policy_validates():
    names = {p.name for p in SHIPPED}
    assert {
        "default.toml",
        "fedncf.toml",
        "filmtrust.toml",
        "lastfm-2k.toml",
        "amazon-video.toml",
        "qb-article.toml",
        "movielens-1m.toml",
    } <= names
    for path in SHIPPED:
        load_policy(path)


def test_default_is_the_authors_setting():
    p = load_policy()
    assert (p.federation.rounds, p.federation.fraction, p.federation.server_lr, p.federation.client_lr) == (
        100,
        0.1,
        0.001,
        0.1,
    )
    assert (p.sam.rho_sh, p.sam.rho_ns, p.federation.chunk_size, p.data.train_negatives) == (0.02, 0.02, 128, 4)
    assert p.rhos() == (0.02, 0.02)


def test_paper_policies_carry_the_authors_rhos():
    expected = {
        "filmtrust": (0.0, 0.02),
        "lastfm-2k": (0.01, 0.01),
        "amazon-video": (0.01, 0.2),
        "qb-article": (0.02, 0.05),
    }
    for name, rhos in expected.items():
        assert load_policy(POLICY_DIR / f"{name}.toml").rhos() == rhos, name


def test_methods_switch_sam_groups():
    p = Policy.model_validate({"sam": {"rho_sh": 0.3, "rho_ns": 0.4}})
    assert p.rhos() == (0.3, 0.4)
    assert p.model_copy(update={"method": "fedncf"}).rhos() == (0.0, 0.0)
    assert p.model_copy(update={"method": "sam-shared"}).rhos() == (0.3, 0.0)
    assert p.model_copy(update={"method": "sam-private"}).rhos() == (0.0, 0.4)


@pytest.mark.parametrize(
    "text, field, expected",
    [
        ("[federation]\nround = 3\n", "federation.round", "unknown key"),
        ("[federation]\nrounds = '3'\n", "federation.rounds", "valid integer"),
        ("[federation]\nrounds = 0\n", "federation.rounds", "greater than or equal to 1"),
        ("[federation]\nfraction = 1.5\n", "federation.fraction", "less than or equal to 1"),
        ("[sam]\nrho_sh = -0.1\n", "sam.rho_sh", "greater than or equal to 0"),
        ("[data]\nvalidation = 1\n", "data.validation", "valid boolean"),
        ("method = 'fedavg'\n", "method", "fedrecgel"),
        ("[federation]\nengine = 'gpu'\n", "federation.engine", "batched"),
        ("[sharpness]\nrho = 1\n", "sharpness", "unknown key"),
    ],
)
def test_bad_fields_are_named_with_their_dotted_path(tmp_path, text, field, expected):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(BadInputError) as info:
        load_policy(path)
    message = str(info.value)
    assert str(path) in message and f"  {field}:" in message and expected in message


def test_invalid_toml_names_the_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[federation]\nrounds = = 3\n")
    with pytest.raises(BadInputError, match=r"(?s)broken.toml: not valid TOML.*line 2"):
        load_policy(path)


def test_missing_policy_file(tmp_path):
    with pytest.raises(BadInputError, match="nope.toml: no such policy file"):
        load_policy(tmp_path / "nope.toml")


def test_integers_are_accepted_where_floats_are_expected(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[sam]\nrho_sh = 0\n")
    assert load_policy(path).sam.rho_sh == 0.0


def test_overrides_are_typed_and_validated():
    p = load_policy(
        None,
        [
            "federation.rounds=7",
            "sam.rho_sh=0.5",
            "data.dataset=filmtrust",
            "model.tower=[64, 32]",
            "data.validation=true",
        ],
    )
    assert (p.federation.rounds, p.sam.rho_sh, p.data.dataset, p.model.tower, p.data.validation) == (
        7,
        0.5,
        "filmtrust",
        [64, 32],
        True,
    )
    with pytest.raises(BadInputError, match=r"(?s)--set federation.rounds=many.*federation.rounds"):
        load_policy(None, ["federation.rounds=many"])
    with pytest.raises(BadInputError, match="expected section.key=value"):
        load_policy(None, ["federation.rounds"])


def test_resolved_toml_round_trips_and_the_digest_tracks_content(tmp_path):
    p = load_policy(None, ["seed=3"])
    path = tmp_path / "resolved.toml"
    path.write_text(p.to_toml())
    again = load_policy(path)
    assert again == p and again.digest() == p.digest()
    assert load_policy(None, ["seed=4"]).digest() != p.digest()


def test_the_schema_describes_every_section():
    schema = Policy.model_json_schema()
    json.dumps(schema)
    assert {"data", "model", "federation", "sam", "evaluation", "checkpoint", "privacy"} <= set(schema["properties"])


def schema_properties(schema: dict) -> dict[str, dict]:
    """Every property of a JSON Schema by dotted path, following $ref into $defs, anyOf/allOf/oneOf and items."""
    defs, found = schema.get("$defs", {}), {}

    def visit(node: dict, prefix: str) -> None:
        if "$ref" in node:
            visit(defs[node["$ref"].removeprefix("#/$defs/")], prefix)
        for sub in node.get("anyOf", []) + node.get("allOf", []) + node.get("oneOf", []):
            visit(sub, prefix)
        if isinstance(node.get("items"), dict):
            visit(node["items"], prefix)
        for name, prop in node.get("properties", {}).items():
            found[prefix + name] = prop
            visit(prop, f"{prefix}{name}.")

    visit(schema, "")
    return found


def model_fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every field of a pydantic model tree by dotted path, nested sections included."""
    out = set()
    for name, info in model.model_fields.items():
        out.add(prefix + name)
        for kind in typing.get_args(info.annotation) or (info.annotation,):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                out |= model_fields(kind, f"{prefix}{name}.")
    return out


def test_the_schema_describes_every_field_of_every_section():
    properties = schema_properties(Policy.model_json_schema())
    assert set(properties) == model_fields(Policy)  # the walk reached every field, the nested DP sections included
    assert "privacy.dp.adaptive_clipping.target_quantile" in properties
    assert [path for path, prop in properties.items() if not prop.get("description", "").strip()] == []


@pytest.mark.parametrize(
    "override", ["privacy.secure_aggregation.scheme=ckks", "privacy.secure_aggregation.ckks.global_scale_bits=38"]
)
def test_ckks_is_refused_naming_the_field_and_the_key_leak(override):
    with pytest.raises(BadInputError, match=r"(?s)privacy\.secure_aggregation.*ckks.*Li and Micciancio"):
        load_policy(None, [override])


def test_the_bfv_policy_loads_and_describes_its_fields():
    p = load_policy(POLICY_DIR / "bfv.toml").privacy.secure_aggregation
    assert p.scheme == "bfv" and bfv_params(p.bfv).plain_modulus.bit_length() == 59
    assert all(f.description for f in type(p.bfv).model_fields.values())


def test_deployment_section_validates_and_shards_users_without_touching_the_digest():
    import numpy as np

    base = load_policy(None)
    p = load_policy(None, ["deployment.nodes=4", "deployment.sharding=round-robin", "deployment.superlink.port=9500"])
    assert p.digest() == base.digest()  # where the roles run is not what is computed: a run can move and resume
    shards = [p.deployment.shard_users(10, s) for s in range(4)]
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(10)) and shards[1].tolist() == [1, 5, 9]
    contiguous = [base.deployment.shard_users(10, s) for s in range(3)]
    assert np.array_equal(np.concatenate(contiguous), np.arange(10))
    for override, field in [
        ("deployment.key_holder_dir=nodes/1", "deployment.key_holder_dir"),
        ("deployment.tls.node_authentication=true", "deployment.tls.node_authentication"),
        ("deployment.stage_timeout=0", "deployment.stage_timeout"),
    ]:
        with pytest.raises(BadInputError, match=field.replace(".", r"\.")):
            load_policy(None, [override])
    # TLS certificates: all three files, or none (deploy local then makes throwaway ones)
    with pytest.raises(BadInputError, match=r"deployment\.tls\.server_cert, deployment\.tls\.server_key"):
        load_policy(None, ["deployment.tls.enabled=true", "deployment.tls.ca_cert=ca.pem"])
    tls = load_policy(None, ["deployment.tls.enabled=true", "deployment.tls.node_authentication=true"]).deployment.tls
    assert tls.generated and tls.node_authentication


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("privacy.secure_aggregation.simulation=fast", r"privacy\.secure_aggregation\.simulation"),
        ("privacy.secure_aggregation.workers=0", r"privacy\.secure_aggregation\.workers"),
        ("privacy.secure_aggregation.tampered=1.5", r"privacy\.secure_aggregation\.tampered"),
    ],
)
def test_bad_simulation_settings_name_their_field(override, message):
    with pytest.raises(BadInputError, match=message):
        load_policy(None, [override])


def test_how_the_secure_sum_is_simulated_does_not_change_the_digest():
    base = load_policy(None, ["privacy.secure_aggregation.scheme=masking"])
    other = load_policy(
        None,
        [
            "privacy.secure_aggregation.scheme=masking",
            "privacy.secure_aggregation.simulation=arithmetic",
            "privacy.secure_aggregation.workers=3",
        ],
    )
    assert other.digest() == base.digest()  # bit-identical by test: a run may resume in the other mode
    tampered = load_policy(
        None, ["privacy.secure_aggregation.scheme=masking", "privacy.secure_aggregation.tampered=0.1"]
    )
    assert tampered.digest() != base.digest()
    assert other.privacy.secure_aggregation.worker_count() == 3


def test_a_secure_sum_needs_ten_clients_unless_a_small_cohort_is_acknowledged():
    masking = "privacy.secure_aggregation.scheme=masking"
    settings = load_policy(None, [masking]).privacy.secure_aggregation
    assert settings.min_clients == 10 and settings.small_cohort_warning() is None
    with pytest.raises(BadInputError, match=r"privacy\.secure_aggregation\.min_clients = 2 is below 10"):
        load_policy(None, [masking, "privacy.secure_aggregation.min_clients=2"])
    small = load_policy(
        None,
        [masking, "privacy.secure_aggregation.min_clients=2", "privacy.secure_aggregation.allow_small_cohort=true"],
    ).privacy.secure_aggregation
    assert "1 colluding or invented clients expose the last one" in small.small_cohort_warning()
    # plaintext sums promise nothing about cohorts; the shipped secure policies sit well above the floor
    assert load_policy(None, ["privacy.secure_aggregation.min_clients=2"]).privacy.secure_aggregation.min_clients == 2
    for name in ("masking", "bfv", "secagg-dp"):
        assert load_policy(POLICY_DIR / f"{name}.toml", []).privacy.secure_aggregation.min_clients == 50


def test_the_resolved_policy_states_the_radii_the_method_uses():
    """fedncf trains without SAM: its resolved policy says rho = 0, not the [sam] defaults it ignores."""
    fedncf = load_policy(POLICY_DIR / "fedncf.toml")
    assert (fedncf.sam.rho_sh, fedncf.sam.rho_ns) == fedncf.rhos() == (0.0, 0.0)
    assert "rho_sh = 0.0" in fedncf.to_toml() and "rho_ns = 0.0" in fedncf.to_toml()
    shared = load_policy(None, ["method=sam-shared", "sam.rho_sh=0.3", "sam.rho_ns=0.4"])
    assert (shared.sam.rho_sh, shared.sam.rho_ns) == (0.3, 0.0)
    assert Policy.model_validate_json(shared.model_dump_json()).digest() == shared.digest()
