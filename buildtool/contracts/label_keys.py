"""Every label and annotation key the stages write and read, declared once: the only module that spells
one (tests/test_label_keys.py refuses a key written out anywhere else, and pins each key here).

Static labels are written by templates/parts/labels.j2 (the render context passes this
module as `label_keys`), build-time ones by the builder, stand-in ones by the bases. Image tests
check the ones that state a fact about the image against the image itself; release reads
the provenance ones.
"""

from __future__ import annotations

PREFIX = "io.dl-images"
OCI_PREFIX = "org.opencontainers.image"

# -- OCI standard labels (org.opencontainers.image.*) -----------------------------------------
OCI_TITLE = f"{OCI_PREFIX}.title"
OCI_DESCRIPTION = f"{OCI_PREFIX}.description"
OCI_VERSION = f"{OCI_PREFIX}.version"
OCI_SOURCE = f"{OCI_PREFIX}.source"
OCI_REVISION = f"{OCI_PREFIX}.revision"        # the full commit (names.check_full_revision)
OCI_CREATED = f"{OCI_PREFIX}.created"
# `buildtool build` writes base.name as the reference the build pulled (the mirror's when BASE_MIRROR
# is set) and base.digest as that reference's digest: a pair that resolves. BASE_UPSTREAM says which
# matrix base it stands for.
OCI_BASE_NAME = f"{OCI_PREFIX}.base.name"
OCI_BASE_DIGEST = f"{OCI_PREFIX}.base.digest"
# From the matrix's `oci:` mapping (defaults < image < version), written by the templates.
OCI_AUTHORS = f"{OCI_PREFIX}.authors"
OCI_URL = f"{OCI_PREFIX}.url"
OCI_DOCUMENTATION = f"{OCI_PREFIX}.documentation"
OCI_VENDOR = f"{OCI_PREFIX}.vendor"
OCI_LICENSES = f"{OCI_PREFIX}.licenses"
# The matrix's `oci:` keys (schema.OciLabels) -> the label each one is written as (templates/parts/labels.j2).
OCI_FROM_MATRIX = {
    "authors": OCI_AUTHORS,
    "url": OCI_URL,
    "documentation": OCI_DOCUMENTATION,
    "vendor": OCI_VENDOR,
    "licenses": OCI_LICENSES,
}

# -- what the image is (static, from the matrix) ------------------------------------------------
CELL = f"{PREFIX}.cell"
FRAMEWORK = f"{PREFIX}.framework"
FRAMEWORK_VERSION = f"{PREFIX}.framework-version"
PYTHON = f"{PREFIX}.python"
ACCELERATOR = f"{PREFIX}.accelerator"
CUDA = f"{PREFIX}.cuda"                     # CUDA version of a GPU image
TESTS = f"{PREFIX}.tests"
RUN_FLAGS = f"{PREFIX}.run.flags"

# -- build-time facts (added by `buildtool build`) ----------------------------------------------
CONTENT_KEY = f"{PREFIX}.content-key"
RUN_PROFILE = f"{PREFIX}.run-profile"       # JSON of the cell's run profile
PACKAGES = f"{PREFIX}.packages"             # JSON name -> version of every package the cell's locks install
BASE_REF = f"{PREFIX}.base.ref"             # the base reference the build pulled (mirror or upstream)
BASE_SOURCE = f"{PREFIX}.base.source"       # how a locally made base was made (mmdebstrap ...)
BASE_ARCHIVE = f"{PREFIX}.base.archive"     # the archive state it was made from: `<InRelease URL> sha256:<hex> <Date>`
BASE_UPSTREAM = f"{PREFIX}.base.upstream"   # the matrix's base (static): base.name is it or its mirror
# A multi-platform cell's build machine image of the base (BUILD_BASE_IMAGE), its digest: in the content key.
BUILD_BASE_DIGEST = f"{PREFIX}.build-base.digest"
PACKAGE_PREFIX = f"{PREFIX}.package."       # one label per package (`<prefix><name>=<version>`), read by notes

# -- stand-ins (test fixtures, never released) ---------------------------------------------------
STANDIN = f"{PREFIX}.standin"                                   # "true" on stand-in bases and images on them
STANDIN_PREFIX = f"{PREFIX}.standin"                            # any key starting so marks a stand-in
STANDIN_FRAMEWORK = f"{PREFIX}.standin.framework-version"       # what a stand-in really carries
STANDIN_PYTHON = f"{PREFIX}.standin.python"                     # the Python a stand-in really has
STANDIN_FOR = f"{PREFIX}.standin.for"                           # the upstream base it stands in for

# -- test fixtures (tests/integration builds them; never released) -------------------------------
FIXTURE = f"{PREFIX}.fixture"                # "true" on every fixture image
FIXTURE_FAULT = f"{PREFIX}.fixture.fault"    # which fault a fixture image carries

# -- containers started by the image tests -------------------------------------------------------
IMAGETEST_RUN = f"{PREFIX}.imagetest.run"   # every container image-tests start carries it (run id)
IMAGETEST_OWNER = f"{PREFIX}.imagetest.owner"   # host:pid of the validation that made a run's network

# -- annotations on artifacts in the registry ----------------------------------------------------
VERDICT_RESULT = f"{PREFIX}.verdict.result"
VERDICT_CELL = f"{PREFIX}.verdict.cell"
VERDICT_SIGNER = f"{PREFIX}.verdict.signer"   # key id that signed the attestation (a hint: the envelope decides)
SBOM_DIGEST = f"{PREFIX}.sbom.digest"   # the attested SBOM's digest (a hint: the signed statement decides)
ARTIFACT_CREATED = OCI_CREATED
ARTIFACT_TITLE = OCI_TITLE
LOCK_TOKEN = f"{PREFIX}.lock.token"
LOCK_HOST = f"{PREFIX}.lock.host"
LOCK_PID = f"{PREFIX}.lock.pid"
LOCK_PURPOSE = f"{PREFIX}.lock.purpose"
LOCK_EXPIRES = f"{PREFIX}.lock.expires"
LOCK_RELEASED = f"{PREFIX}.lock.released"

# -- CycloneDX properties of the SBOM (`<namespace>:<fact>`) ----------------------------------------
SBOM_PROPERTY = PREFIX


# -- labels that state a fact about the image, checked against the image itself -----------------
# (image-tests/common/test_labels.py). The value says what in the image proves the label:
#   python             the major.minor of the image's python3
#   framework          the framework table's module for this name imports
#   framework-version  the imported module's __version__ (common/test_contents.py compares versions)
#   accelerator        cpu: the framework was built without CUDA; cuda: with CUDA
#   cuda               the CUDA version the framework was built with (major.minor)
#   version            the framework's release (pip cells: 2.13 -> torch 2.13.x) or, on NGC, the
#                      container's own NVIDIA_<FRAMEWORK>_VERSION
# Every static label the templates write is also checked against the matrix cell the image
# names (validate renders the cell's Dockerfile to know them). Build-time provenance (revision,
# created, base digest, content key, run profile) is read by release, not checked here.
FACTS: dict[str, str] = {
    PYTHON: "python",
    FRAMEWORK: "framework",
    FRAMEWORK_VERSION: "framework-version",
    ACCELERATOR: "accelerator",
    CUDA: "cuda",
    OCI_VERSION: "version",
    STANDIN_PYTHON: "python",
    STANDIN_FRAMEWORK: "framework-version",
}
# On a stand-in (a test fixture standing in for an NGC image) these describe the real upstream
# image, not the stand-in's contents: the stand-in's own labels above are checked instead.
UPSTREAM_CLAIMS = frozenset({PYTHON, FRAMEWORK_VERSION, ACCELERATOR, CUDA, OCI_VERSION})


def standin_keys(labels: dict[str, str]) -> list[str]:
    """Every stand-in label an image carries: any key starting STANDIN_PREFIX marks a stand-in,
    whatever its value (`standin=false` beside `standin.for=...` is still a stand-in)."""
    return sorted(key for key in labels if key.startswith(STANDIN_PREFIX))
