"""fedrecgel-secure: FedRecGEL federated recommendation with secure aggregation and client-level DP."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fedrecgel-secure")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
