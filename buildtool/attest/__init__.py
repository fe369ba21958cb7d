"""Attestation, in one place: DSSE envelopes and signing keys (dsse, keys), in-toto statements (intoto), the
verdict and provenance as statements (verdict_statement, provenance_model), Sigstore bundles (sigstore_bundle,
bundles), who may sign what (trust), and artifacts attached to image digests: written and read through the OCI
1.1 referrers API or its tag-schema fallback (referrers), each signed one opened once (attested), the provenance's
(provenance_store). Stages call it with the content to sign; `registry` below it only speaks the distribution
API."""
