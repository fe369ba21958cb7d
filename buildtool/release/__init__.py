"""Stage 5: promoting validated digests to release tags, release manifests and notes."""
