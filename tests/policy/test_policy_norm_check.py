"""privacy.secure_aggregation.dpf.norm_check: on by default under DP, its grid the finest Field64 holds for the
bound, and the settings it cannot run under refused with the fields named (exit code 2 through the CLI)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.main import app
from fedrecgel_secure.errors import BadInputError
from fedrecgel_secure.policy import load_policy
from fedrecgel_secure.privacy.secagg.settings import norm_bound

DPF_DP = [
    "privacy.secure_aggregation.scheme=dpf",
    "privacy.dp.enabled=true",
    "privacy.dp.noise_multiplier=1.0",
    "privacy.dp.clip_norm=0.5",
]


def test_under_dp_the_check_is_on_and_the_grid_is_the_finest_the_field_holds():
    # evaluation.scope unset: a deployment may resolve it to "round", where each user reports HR and NDCG inside
    # the sum, each adding up to 1 to the norm²: 31 - log2(√(0.25 + 2)) = 30.4
    p = load_policy(None, DPF_DP)
    assert p.privacy.secure_aggregation.dpf.norm_check and p.privacy.secure_aggregation.frac_bits == 30
    assert norm_bound(p) == 0.5 and norm_bound(p, reports=2) == pytest.approx((0.25 + 2) ** 0.5)
    everyone = load_policy(None, [*DPF_DP, "evaluation.scope=all"])  # nothing reported: 31 - log2(0.5)
    assert everyone.privacy.secure_aggregation.frac_bits == 32
    reporting = load_policy(None, [*DPF_DP, "data.validation=true", "evaluation.scope=round"])
    assert reporting.privacy.secure_aggregation.frac_bits == 29  # four metrics: 31 - log2(√(0.25 + 4)) = 29.96
    again = load_policy(None, [*DPF_DP, "privacy.secure_aggregation.frac_bits=30"])  # the resolved policy reloads
    assert again.digest() == p.digest()


def test_without_dp_or_with_the_check_off_nothing_changes():
    plain = load_policy(None, ["privacy.secure_aggregation.scheme=dpf"])
    assert plain.privacy.secure_aggregation.frac_bits == 36 and norm_bound(plain) == 0.0
    off = load_policy(None, [*DPF_DP, "privacy.secure_aggregation.dpf.norm_check=false"])
    assert off.privacy.secure_aggregation.frac_bits == 36 and norm_bound(off) == 0.0
    bfv = load_policy(None, [*DPF_DP[1:], "privacy.secure_aggregation.scheme=bfv"])
    assert norm_bound(bfv) == 0.0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("privacy.secure_aggregation.frac_bits=36", "set frac_bits to 30 or less"),
        ("privacy.dp.adaptive_clipping.initial=0.2", "adaptive_clipping"),
        ("privacy.secure_aggregation.dpf.value_bits=32", "value_bits = 64"),
    ],
)
def test_settings_the_check_cannot_run_under_are_refused_naming_the_fields(override, message):
    with pytest.raises(BadInputError, match=message):
        load_policy(None, [*DPF_DP, override])


def test_the_cli_refuses_a_grid_too_fine_for_the_check_with_exit_code_2(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(
        "[privacy.dp]\nenabled = true\nnoise_multiplier = 1.0\nclip_norm = 0.5\n"
        '[privacy.secure_aggregation]\nscheme = "dpf"\nfrac_bits = 40\n'
    )
    result = CliRunner().invoke(app, ["policy", "validate", str(path)])
    assert result.exit_code == 2
    assert "privacy.secure_aggregation.dpf.norm_check" in result.output and "frac_bits" in result.output
