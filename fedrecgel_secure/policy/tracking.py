"""[tracking]: where a run's records are logged besides its run directory (TensorBoard, MLflow)."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, field_validator

from fedrecgel_secure.policy.section import Section


class TrackingPolicy(Section):
    """Experiment trackers fed with every evaluation record (needs the ``tracking`` extra). They change nothing a run
    computes, so they are outside the policy digest: a run may resume with tracking turned on or off."""

    tensorboard: bool = Field(False, description="Write TensorBoard event files into RUN_DIR/tensorboard.")
    mlflow: bool | str = Field(
        False,
        description="Log to MLflow. true: a local file store in the run directory (RUN_DIR/mlruns; a study's runs"
        " share STUDY_DIR/mlruns), no server needed. A string: a tracking URI (file:///path, sqlite:///path.db,"
        " http://host:5000); credentials go in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, not here.",
    )
    experiment: str = Field("fedrecgel", min_length=1, description="The MLflow experiment the runs are logged in.")

    @field_validator("mlflow")
    @classmethod
    def _is_a_uri(cls, v: bool | str) -> bool | str:
        if isinstance(v, bool):
            return v
        parts = urlsplit(v)
        if len(parts.scheme) < 2:  # "" or a Windows drive letter
            raise ValueError("expected true, false or a tracking URI with a scheme (file:///path, sqlite:///path.db)")
        if parts.password is not None:
            # the policy is copied into policy.resolved.toml and every checkpointed run: no secrets in it
            raise ValueError("the URI holds a password; set MLFLOW_TRACKING_PASSWORD instead")
        return v
