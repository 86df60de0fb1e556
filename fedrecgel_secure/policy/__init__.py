"""Policy files: one pydantic model tree, read from TOML, the single source of truth for a run.

Unknown keys are errors and types are strict. Every error names the file, the
dotted field path and what was expected.

One module per section of the file; every public name is re-exported here, so
``from fedrecgel_secure.policy import X`` is the one way to import them:

* :mod:`.data`: ``[data]``;
* :mod:`.model`: ``[model]`` and ``[sam]``;
* :mod:`.federation`: ``[federation]``, ``[evaluation]`` and ``[checkpoint]``;
* :mod:`.dp`: ``[privacy.dp]``; :mod:`.secagg`: ``[privacy.secure_aggregation]``;
  :mod:`.privacy`: ``[privacy]`` and ``[privacy.audit]``;
* :mod:`.deployment`: ``[deployment]``;
* :mod:`.tracking`: ``[tracking]``;
* :mod:`.root`: the whole :class:`Policy` and its digest;
* :mod:`.files`: reading a policy file with ``--set`` overrides.

This package imports neither :mod:`fedrecgel_secure.privacy` nor torch:
``privacy`` imports the settings from here, never the reverse.
"""

from fedrecgel_secure.policy.data import DataPolicy
from fedrecgel_secure.policy.deployment import (
    DEPLOY,
    DeploymentPolicy,
    IdentityKey,
    SuperLinkPolicy,
    TlsPolicy,
)
from fedrecgel_secure.policy.dp import (
    AccountantKind,
    AdaptiveClippingSettings,
    DPSettings,
    GroupFractions,
    Mode,
    NoiseSource,
)
from fedrecgel_secure.policy.federation import CheckpointPolicy, EvaluationPolicy, FederationPolicy
from fedrecgel_secure.policy.files import (
    POLICY_DIR,
    apply_overrides,
    describe_errors,
    is_policy_name,
    load_policy,
    packaged_policy_names,
    parse_override,
    policy_file,
    read_policy_data,
)
from fedrecgel_secure.policy.model import ModelPolicy, SamPolicy
from fedrecgel_secure.policy.privacy import AuditPolicy, PrivacyPolicy
from fedrecgel_secure.policy.root import Method, Policy
from fedrecgel_secure.policy.secagg import BfvPolicy, DpfPolicy, MaskingPolicy, SecureAggregationPolicy
from fedrecgel_secure.policy.section import Section
from fedrecgel_secure.policy.tracking import TrackingPolicy

__all__ = [
    "DEPLOY",
    "POLICY_DIR",
    "AccountantKind",
    "AdaptiveClippingSettings",
    "AuditPolicy",
    "BfvPolicy",
    "CheckpointPolicy",
    "DPSettings",
    "DataPolicy",
    "DeploymentPolicy",
    "DpfPolicy",
    "EvaluationPolicy",
    "FederationPolicy",
    "GroupFractions",
    "IdentityKey",
    "MaskingPolicy",
    "Method",
    "Mode",
    "ModelPolicy",
    "NoiseSource",
    "Policy",
    "PrivacyPolicy",
    "SamPolicy",
    "Section",
    "SecureAggregationPolicy",
    "SuperLinkPolicy",
    "TlsPolicy",
    "TrackingPolicy",
    "apply_overrides",
    "describe_errors",
    "is_policy_name",
    "load_policy",
    "packaged_policy_names",
    "parse_override",
    "policy_file",
    "read_policy_data",
]
