"""The OCI distribution API: the client (requests, retries, credentials as the docker CLI keys them), what a
registry's answers mean, image indexes. What is attached to digests is buildtool.attest's."""
