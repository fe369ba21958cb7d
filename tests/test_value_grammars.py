"""Accept/reject tables at the boundaries of every matrix value grammar (buildtool/matrix/values.py,
and the checks schema.py adds on values).

Each row is an exact input and what the grammar does with it: ACCEPT, or a rejection with a
fragment of its message (the cause, so a row cannot pass by failing for another reason). Rows sit
on both sides of each limit, written as literals: a limit moved by one, a minimum halved, an `or`
turned into `and` or a check left out makes a row fail. The whole-file corpus
(test_matrix_corpus.py) checks that these messages reach the user with file:line and key.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from buildtool.common.errors import MatrixError
from buildtool.matrix import values
from buildtool.matrix.loader import load_matrix
from buildtool.matrix.schema import RunProfile, ValidateSettings
from tests.conftest import FIXTURE_MATRIX, REPO

ACCEPT = None


def rows(*table: tuple[Any, str | None]) -> list[Any]:
    """pytest params with short, readable ids: `accept-'1g'`, `reject-'512m'`."""
    params = []
    for value, expected in table:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else f"{shown[:20]}...len{len(value)}"
        params.append(pytest.param(value, expected, id=f"{'accept' if expected is ACCEPT else 'reject'}-{shown}"))
    return params


def check(grammar: Callable[[Any], Any], value: Any, expected: str | None) -> None:
    if expected is ACCEPT:
        grammar(value)                      # raises ValueError, failing the row, if refused
        return
    with pytest.raises(ValueError) as refused:
        grammar(value)
    assert expected in str(refused.value), str(refused.value)


# -- image names: [a-z0-9] words joined by single '-' or '.', at most 128 characters ------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    ("a" * 128, ACCEPT),                       # the longest name
    ("a" * 129, "is 129 characters; an image name has at most 128"),
    ("a-" * 63 + "ab", ACCEPT),                # 128 with separators
    ("a-" * 64 + "a", "is 129 characters"),
    ("9", ACCEPT),
    ("pytorch-cpu", ACCEPT),
    ("a.b", ACCEPT),
    ("", "not a valid image name"),
    ("A", "not a valid image name"),
    ("PyTorch_CUDA", "not a valid image name"),
    ("a_b", "not a valid image name"),
    ("a--b", "not a valid image name"),
    ("a..b", "not a valid image name"),
    ("-a", "not a valid image name"),
    ("a-", "not a valid image name"),
    ("a/b", "not a valid image name"),
    ("a b", "not a valid image name"),
    ("dev", ACCEPT),
    ("pytorch-devel", ACCEPT),
    ("pytorch.dev", ACCEPT),
    # <name>-dev is the dev repository of <name> (contracts.names.image_of_repo_path reads it so).
    ("pytorch-cpu-dev", "ends in '-dev': pytorch-cpu-dev is the repository of the dev images of pytorch-cpu"),
))
def test_image_name(value: str, expected: str | None) -> None:
    check(values.image_name, value, expected)


# -- cell versions: PEP 440 and a tag word of at most 64 characters ----------------------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    ("25.10", ACCEPT),
    ("2.13", ACCEPT),
    ("1.0+cpu", ACCEPT),
    ("v1", ACCEPT),
    ("1" + "0" * 63, ACCEPT),                  # 64 characters
    ("1" + "0" * 64, "at most 64 characters"),  # 65
    ("1.0 ", "cannot be used in an image tag"),
    ("twenty-five", "does not parse as a version"),
    ("1.0_1", "does not parse as a version"),
    ("", "does not parse as a version"),
))
def test_cell_version(value: str, expected: str | None) -> None:
    check(values.cell_version, value, expected)


# -- package versions (pinned as name==version): PEP 440, exactly as written -------------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    ("2.21.0", ACCEPT),
    ("2.9.0a0", ACCEPT),
    ("2.13.0+cpu", ACCEPT),
    ("1!2.0", ACCEPT),
    ("2.0.post1.dev2", ACCEPT),
    (" 2.0", "has spaces around it"),
    ("2.0 ", "has spaces around it"),
    ("latest", "is not a version"),
    ("", "is not a version"),
    ("$(id)", "is not a version"),
    ("2.13.0+cpu\nRUN id", "is not a version"),
))
def test_package_version(value: str, expected: str | None) -> None:
    check(values.version, value, expected)


@pytest.mark.parametrize(("value", "expected"), rows(
    ("3.11", ACCEPT),
    ("3.12", ACCEPT),
    ("10.100", ACCEPT),
    ("3", "is not a Python version"),
    ("3.11.7", "is not a Python version"),
    ("3.x", "is not a Python version"),
    ("py3.11", "is not a Python version"),
))
def test_python_version(value: str, expected: str | None) -> None:
    check(values.python_version, value, expected)


# -- package names (PEP 508) and pinned requirements --------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    ("torch", ACCEPT),
    ("a", ACCEPT),
    ("A_B", ACCEPT),
    ("zope.interface", ACCEPT),
    ("torch-tb-profiler", ACCEPT),
    ("", "is not a package name"),
    ("-a", "is not a package name"),
    ("a-", "is not a package name"),
    ("a b", "is not a package name"),
    ("tensorboard$(id)", "is not a package name"),
))
def test_package_name(value: str, expected: str | None) -> None:
    check(values.dist_name, value, expected)


@pytest.mark.parametrize(("value", "expected"), rows(
    ("torch==2.13.0+cpu", ACCEPT),
    ("torch===2.13.0", ACCEPT),
    ("torch==2.13.*", ACCEPT),
    ("torch>=2.0", ACCEPT),
    ("torch[extra]==1.0", ACCEPT),
    ("torch", "names no version"),
    ("torch @ https://example.org/torch.whl", "installs from a URL"),
    ("torch==abc", "is not a PEP 508 requirement"),
    ("torch==2.13.0\nRUN id", "contains a line break"),
    ('torch==2.13.0" && id && "', "is not a PEP 508 requirement"),
))
def test_pinned_requirement(value: str, expected: str | None) -> None:
    check(values.requirement, value, expected)


# -- Debian package names: policy 5.6.1 name, optional :arch and =version ----------------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    ("ab", ACCEPT),                            # the shortest name
    ("a", "at least two characters"),
    ("procps", ACCEPT),
    ("g++", ACCEPT),
    ("python3-venv", ACCEPT),
    ("libc6:amd64", ACCEPT),
    ("curl=7.88.1-10+deb12u5", ACCEPT),
    ("libc6:AMD64", "is not a Debian package name"),
    ("Curl", "is not a Debian package name"),
    ("-curl", "is not a Debian package name"),
    ("curl=", "is not a Debian package name"),
    ("curl=abc", "is not a Debian package name"),
    ("curl;id", "is not a Debian package name"),
))
def test_apt_package(value: str, expected: str | None) -> None:
    check(values.apt_package, value, expected)


# -- URLs: index URLs (https, http, file) and the source (https, http) -------------------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    ("https://pypi.org/simple", ACCEPT),
    ("https://download.pytorch.org/whl/cpu", ACCEPT),
    ("http://127.0.0.1:8080/simple", ACCEPT),
    ("https://pypi.example.org/a%20b", ACCEPT),
    # Credentials in any part of the userinfo are refused.
    ("https://TOKEN@pypi.example.org/simple", "carries credentials"),
    ("https://user:pass@pypi.example.org/simple", "carries credentials"),
    ("https://:pass@pypi.example.org/simple", "carries credentials"),
    ("https://user:@pypi.example.org/simple", "carries credentials"),
    ("https://@pypi.example.org/simple", "carries credentials"),
    # file:// needs an absolute path.
    ("file:///srv/wheels", ACCEPT),
    ("file:///", ACCEPT),
    ("file:wheels", "a file URL needs an absolute path"),
    ("file:", "a file URL needs an absolute path"),
    ("file://localhost/srv/wheels", ACCEPT),
    ("file://srv/wheels", "a file URL names a folder on this machine, with no host: three slashes, "
                          "e.g. file:///srv/wheels"),
    ("ftp://pypi.example.org/simple", "must start with https://, http:// or file://"),
    ("pypi.example.org/simple", "must start with https://, http:// or file://"),
    ("https://", "names no host"),
    ("https://pypi.example.org:99999/simple", "is not a URL"),
    ("https://pypi.example.org/simple && id", "contains a space"),
    ("https://pypi.example.org/$(id)", "contains '$'"),
    ("https://pypi.example.org/'x'", "contains \"'\""),
))
def test_index_url(value: str, expected: str | None) -> None:
    check(values.index_url, value, expected)


@pytest.mark.parametrize(("value", "expected"), rows(
    ("https://github.com/dl-images/dl-images", ACCEPT),
    ("http://git.example.org/dl-images", ACCEPT),
    ("https://TOKEN@github.com/dl-images/dl-images", "carries credentials"),
    ("https://user:pass@github.com/dl-images", "carries credentials"),
    ("https://:pass@github.com/dl-images", "carries credentials"),
    ("file:///srv/dl-images", "the source must start with https:// or http://"),
    ("github.com/dl-images", "the source must start with https:// or http://"),
))
def test_source_url(value: str, expected: str | None) -> None:
    check(values.source_url, value, expected)


# -- image references: pinned by tag or digest ----------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    ("nvcr.io/nvidia/pytorch:25.10-py3", ACCEPT),
    ("docker.io/library/debian:bookworm-slim", ACCEPT),
    ("debian@sha256:" + "a" * 64, ACCEPT),
    ("127.0.0.1:5000/a/b:c", ACCEPT),
    ("nvcr.io/nvidia/tensorflow", "names no tag or digest"),
    ("nvcr.io/nvidia/PyTorch:25.10-py3", "repository names are lower case"),
    ("nvcr.io/nvidia/pytorch:", "names no tag"),
    ("nvcr.io/nvidia/pytorch 25.10-py3", "contains whitespace"),
    # Digests Docker pulls by (go-digest): sha256, sha384, sha512 with their lengths, lower-case hex.
    ("debian@sha384:" + "a" * 96, ACCEPT),
    ("nvcr.io/nvidia/pytorch:25.10-py3@sha512:" + "0a" * 64, ACCEPT),
    ("debian@md5:" + "a" * 32, "digest md5:<32 hex digits> is not one Docker pulls by (sha256: 64, sha384: 96, "
                               "sha512: 128 lower-case hex digits)"),
    ("debian@sha512:" + "A" * 128, "digest sha512:<128 hex digits> is not one Docker pulls by"),
    ("debian@sha512:" + "a" * 64, "digest sha512:<64 hex digits> is not one Docker pulls by"),
    ("debian@sha256:abc", "digest sha256:<3 hex digits> is not one Docker pulls by"),   # not read as credentials
    ("robot:s3cr3t@ghcr.io/team/x:1", "cannot carry credentials"),
))
def test_image_reference(value: str, expected: str | None) -> None:
    check(values.reference, value, expected)


# -- paths and free text ------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    ("/workspace", ACCEPT),
    ("/", ACCEPT),
    ("workspace", "is not an absolute path"),
    ("/a/../b", "is not an absolute path"),
    ("/a b", "is not an absolute path"),
    ("/a;id", "is not an absolute path"),
))
def test_workdir(value: str, expected: str | None) -> None:
    check(values.workdir, value, expected)


@pytest.mark.parametrize(("value", "expected"), rows(
    ("images/pip.Dockerfile.j2", ACCEPT),
    ("../../etc/passwd", "is not a path inside templates/"),
    ("/etc/passwd", "is not a path inside templates/"),
    ("images/nope.Dockerfile.j2", "not found under templates/"),
    ("images/pytorch pip.j2", "is not a path inside templates/"),
))
def test_template_path(value: str, expected: str | None) -> None:
    check(lambda text: values.template_path(text, REPO / "templates"), value, expected)


@pytest.mark.parametrize(("value", "expected"), rows(
    ("a" * 300, ACCEPT),
    ("a" * 301, "is 301 characters; keep it to at most 300"),
    ("PyTorch on CPU; same tools as pytorch-ngc.", ACCEPT),
    ("", "is empty"),
    ("   ", "is empty"),
    ("a\nb", "contains a line break"),
    ("a\u2028b", "contains a line break"),
    ("a\x00", "control character"),
    ("a\tb", "control character"),
    # Format characters (Unicode category Cf): invisible, they reorder or hide what a reader sees (issue 37).
    ("PyTorch \u202eUPC no", "contains the format character U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ("ja\u200bx", "contains the format character U+200B (ZERO WIDTH SPACE)"),
    ("\ufeffPyTorch", "contains the format character U+FEFF (ZERO WIDTH NO-BREAK SPACE)"),
    ("a\u2066b\u2069", "contains the format character U+2066 (LEFT-TO-RIGHT ISOLATE)"),
    ("a\u00adb", "contains the format character U+00AD (SOFT HYPHEN)"),
))
def test_one_line(value: str, expected: str | None) -> None:
    check(values.one_line, value, expected)


def test_every_format_character_is_refused_in_free_text() -> None:
    """Every code point of category Cf, not a list of known ones: a mutation that lets one through fails here."""
    import sys
    import unicodedata

    formats = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cf"]
    assert len(formats) > 100
    allowed = [f"U+{ord(c):04X}" for c in formats if _accepts(values.one_line, f"use {c} here")]
    assert allowed == []


def _accepts(check_value, text: str) -> bool:  # noqa: ANN001
    try:
        check_value(text)
    except ValueError:
        return False
    return True


def test_a_template_path_that_leads_outside_templates_through_a_link_is_refused(tmp_path: Path) -> None:
    """A file inside templates/ by name, outside it by a symlink (of the file, or of a folder on the way)."""
    templates, outside = tmp_path / "templates", tmp_path / "elsewhere"
    (templates / "images").mkdir(parents=True)
    outside.mkdir()
    (outside / "evil.Dockerfile.j2").write_text("FROM scratch\n")
    (templates / "images" / "ok.Dockerfile.j2").write_text("FROM scratch\n")
    (templates / "images" / "linked.Dockerfile.j2").symlink_to(outside / "evil.Dockerfile.j2")
    (templates / "shared").symlink_to(outside, target_is_directory=True)
    assert values.template_path("images/ok.Dockerfile.j2", templates) == "images/ok.Dockerfile.j2"
    for text in ("images/linked.Dockerfile.j2", "shared/evil.Dockerfile.j2"):
        with pytest.raises(ValueError, match=r"leads outside templates/ \(through a link\)"):
            values.template_path(text, templates)


# -- run.shm_size: a whole number with k, m or g (or bytes), at least 1g --------------------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    ("1g", ACCEPT),                            # exactly the minimum, in each unit
    ("1G", ACCEPT),
    ("1024m", ACCEPT),
    ("1048576k", ACCEPT),
    ("1073741824", ACCEPT),
    (1073741824, ACCEPT),
    ("1073741823", "is below the 1g of /dev/shm"),   # one byte short
    (1073741823, "is below the 1g of /dev/shm"),
    ("1048575k", "is below the 1g of /dev/shm"),
    ("1023m", "is below the 1g of /dev/shm"),
    ("768m", "is below the 1g of /dev/shm"),
    ("512m", "is below the 1g of /dev/shm"),         # half the minimum
    ("0", "is below the 1g of /dev/shm"),
    (0, "is below the 1g of /dev/shm"),
    ("8g", ACCEPT),
    ("2048M", ACCEPT),
    ("1048576g", ACCEPT),                      # 2^50 bytes: the largest
    ("1048577g", "larger than any machine's memory"),
    (-1, "is not a size"),
    ("-1", "is not a size"),
    ("1.5g", "is not a size; write it like shm_size: 1536m"),
    ("8GB", "is not a size; write it like shm_size: 8g"),
    ("8Gi", "is not a size"),
    ("8gb", "is not a size"),
    ("1t", "is not a size; write it like shm_size: 1024g"),
    ("8 g", "is not a size"),
    (" 8g", "is not a size"),
    ("", "is not a size"),
    (True, "must be a size like 8g"),
    (1.5, "must be a size like 8g"),
    (None, "must be a size like 8g"),
))
def test_shm_size(value: object, expected: str | None) -> None:
    check(values.shm_size, value, expected)


# -- run.ulimits: known names, whole numbers from -1 (unlimited) to 2^63-1 -------------------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    (-1, ACCEPT),
    (0, ACCEPT),
    (67108864, ACCEPT),
    (2**63 - 1, ACCEPT),
    (2**63, "is out of range"),
    (-2, "is out of range"),
    (True, "must be a whole number"),
    (1.0, "must be a whole number"),
    ("1", "must be a whole number"),
    ("unlimited", "write -1 for unlimited"),
    (None, "must be a whole number"),
))
def test_ulimit_value(value: object, expected: str | None) -> None:
    check(values.ulimit, value, expected)


@pytest.mark.parametrize(("value", "expected"), rows(
    ("memlock", ACCEPT),
    ("stack", ACCEPT),
    ("nofile", ACCEPT),
    ("stacks", "Input should be"),
    ("MEMLOCK", "Input should be"),
    ("", "Input should be"),
))
def test_ulimit_name(value: str, expected: str | None) -> None:
    def grammar(name: str) -> RunProfile:
        try:
            return RunProfile.model_validate({"ulimits": {name: 1}})
        except ValidationError as exc:
            raise ValueError(str(exc)) from None
    check(grammar, value, expected)


# -- validate.deadline_s: 60 s to 3 h ---------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    (60, ACCEPT),
    (59, "must be between 60 and 10800 seconds"),
    (10800, ACCEPT),
    (10801, "must be between 60 and 10800 seconds"),
    ("600", "Input should be a valid integer"),
))
def test_deadline(value: object, expected: str | None) -> None:
    def grammar(seconds: object) -> ValidateSettings:
        try:
            return ValidateSettings.model_validate({"deadline_s": seconds})
        except ValidationError as exc:
            raise ValueError(str(exc)) from None
    check(grammar, value, expected)


# -- schema: the matrix format ------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    (1, ACCEPT),
    (2, "must be 1"),
    (0, "must be 1"),
    (True, "got True"),
    (1.0, "got 1.0"),
    ("1", "write it unquoted"),
))
def test_schema_version(value: object, expected: str | None) -> None:
    check(values.schema_version, value, expected)


# -- release tag templates: only {version} and {release}, no format spec or conversion ---------------------
@pytest.mark.parametrize(("value", "expected"), rows(
    ("{version}-{release}", ACCEPT),
    ("{version}", ACCEPT),
    ("{release}", ACCEPT),
    ("latest", ACCEPT),
    ("v{version}_{release}", ACCEPT),
    ("{version:>10}", "takes no format or conversion"),
    ("{version:s}", "takes no format or conversion"),
    ("{release:.3}", "takes no format or conversion"),
    ("{version!r}", "takes no format or conversion"),
    ("{version!s:}", "takes no format or conversion"),
    ("{nope}", "unknown placeholder {nope}"),
    ("{verison}", "did you mean `version`?"),
    ("{}", "unknown placeholder {}"),
    ("{0}", "unknown placeholder {0}"),
    ("{version.real}", "unknown placeholder {version.real}"),
    ("{version[0]}", "unknown placeholder {version[0]}"),
    ("{version", "is malformed"),
    ("}", "is malformed"),
    ("", "tag template is empty"),
))
def test_tag_template(value: str, expected: str | None) -> None:
    check(values.tag_template, value, expected)


# What a template renders to for cell version 2.13 and the longest plausible release (25 characters):
# a Docker tag of at most 128 characters, not starting with '.' or '-'.
@pytest.mark.parametrize(("value", "expected"), rows(
    ("{version}-{release}", ACCEPT),
    ("x" * 103 + "{release}", ACCEPT),                     # 128 characters
    ("x" * 104 + "{release}", "renders to 129 characters"),
    ("_{version}", ACCEPT),
    ("-{version}", "which is not a Docker tag"),
    (".{version}", "which is not a Docker tag"),
    ("{version}/{release}", "which is not a Docker tag"),
    ("{version}:{release}", "which is not a Docker tag"),
    ("{{version}}", "renders to '{2.13}'"),      # escaped braces pass the template grammar, not the tag's
    ("{version:}", "which is not a Docker tag"),  # an empty spec, likewise
))
def test_rendered_tag(value: str, expected: str | None) -> None:
    check(lambda template: values.rendered_tag(template, "2.13"), value, expected)


# The release rules schema.py adds, through a whole load of the fixture matrix.
@pytest.mark.parametrize(("tags", "expected"), rows(
    ('["{version}-{release}"]', ACCEPT),
    ('["{release}-{version}", "{version}-{release}"]', ACCEPT),
    ('["{version}"]', "immutable tag template '{version}' has no {release}"),
    ('["latest"]', "immutable tag template 'latest' has no {release}"),
    ("[]", "lists no immutable tag"),
    ('["{version}-{release}", "{version}-{release}"]', "twice for"),
))
def test_immutable_tags(tmp_path, tags: str, expected: str | None) -> None:
    text = FIXTURE_MATRIX.read_text()
    assert '    tags: ["{version}-{release}"]' in text
    (tmp_path / "matrix.yaml").write_text(text.replace('    tags: ["{version}-{release}"]', f"    tags: {tags}", 1))

    def grammar(_: str) -> object:
        try:
            return load_matrix(tmp_path / "matrix.yaml", REPO / "templates", tests_dir=REPO / "image-tests")
        except MatrixError as exc:
            raise ValueError(str(exc)) from None
    check(grammar, tags, expected)


# -- a final line break: `$` matches before it, so a grammar must match the whole text ---------------------------
@pytest.mark.parametrize(("grammar", "value"), [
    (values.image_name, "pytorch-cpu"), (values.cell_version, "2.13"), (values.python_version, "3.12"),
    (values.workdir, "/workspace"), (values.apt_package, "curl"), (values.dist_name, "torch"),
    (values.version, "2.13.0"), (values.requirement, "torch==2.13.0"), (values.spdx_expression, "BSD-3-Clause"),
    (values.index_url, "https://pypi.org/simple"), (values.source_url, "https://github.com/dl-images/dl-images"),
    (lambda text: values.template_path(text, None), "pytorch.Dockerfile.j2"),
], ids=lambda p: getattr(p, "__name__", None) if callable(p) else repr(p))
def test_a_value_with_a_final_line_break_is_refused(grammar: Callable[[str], Any], value: str) -> None:
    """`python: "3.12\\n"` (a quoted YAML value) passed `^[0-9]+\\.[0-9]+$` with .match, as did an image name, a
    workdir, an apt or pip package name and a cell version with a final line break: they reached the rendered
    Dockerfiles and tags."""
    grammar(value)
    with pytest.raises(ValueError):
        grammar(value + "\n")
