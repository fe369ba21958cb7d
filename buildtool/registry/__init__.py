"""The OCI distribution API client and the artifacts attached to image digests (referrers)."""
