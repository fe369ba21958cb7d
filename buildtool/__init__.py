"""Build and verify deep-learning container images from one version matrix."""

__version__ = "0.1.0"
