"""What "the image contains framework version X" means, for every kind of build we ship.

A framework's `__version__` is a PEP 440 version whose local part (after `+`) says which
build it is: PyPI/PyTorch wheels report `2.13.0+cpu` or `2.13.0+cu130`, NGC's PyTorch reports
`2.9.0a0+50eac811a6.nv25.10` (source commit and container release), TensorFlow reports a plain
`2.17.0`, and JAX from PyPI a plain `0.10.2` while a JAX built from its git tree (NGC builds
JAX from source) spells itself as jax's version.py does: `0.7.2.dev20251013+1a2b3c4d`. A claim
(the matrix's `framework_version`, a label) is checked in two parts:

- the public part (release, pre-release) must equal the claim's, compared with packaging.version
  (so `2.13` and `2.13.0` agree); where the scheme allows source builds (SOURCE, on NGC cells
  only) a `.devN` of the claimed release is that release built from its tree;
- the local part must be the one the cell's build produces: the claim's own local part when it
  has one, else the cell's rule (`+cpu` on CPU cells, `+cu<CUDA>` on PyPI CUDA cells, NGC's
  `<sha>.nvYY.MM` with the cell's container release on NGC cells).

validate computes the rule from the cell (`expectation`) and writes it into the target file;
image-tests/common/test_contents.py applies it (`problems`). Both import this module.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from buildtool.contracts.gpu import cuda_tag

# The names of the schemes (frameworks.Framework.local_versions); SCHEMES below says what each means.
TORCH = "torch"
PLAIN = "plain"
SOURCE = "source"

_NGC_BASE_RE = re.compile(r"^nvcr\.io/nvidia/[^:@]+:(?P<yy>[0-9]{2})\.(?P<mm>[0-9]{2})(?:[-.].*)?\Z")


@dataclass(frozen=True)
class Expectation:
    """The local part a claim's build must report: a regex over the raw local part ("" = none)."""

    local_pattern: str
    local_text: str       # for messages: "+cu130 (PyPI's CUDA 13.0 build)"
    source_dev: bool = False   # a .devN of the claimed release passes (a build from its source tree)


def ngc_release(base: str) -> str | None:
    """`nvcr.io/nvidia/pytorch:25.10-py3` -> `25.10`; None for a base that is not NGC's."""
    match = _NGC_BASE_RE.match(base)
    return f"{match.group('yy')}.{match.group('mm')}" if match else None


def _ngc_local(release: str) -> str:
    # NGC writes the month with two digits (nv25.01); accept one too (packaging normalises it away).
    yy, mm = release.split(".")
    return rf"nv{int(yy)}\.0?{int(mm)}"


def _torch(accelerator: str, cuda: str | None, ngc: str | None) -> Expectation:
    if ngc:
        return Expectation(rf"[0-9a-f]{{7,40}}\.{_ngc_local(ngc)}",
                           f"+<commit>.nv{ngc} (NGC's PyTorch of container release {ngc})")
    if accelerator == "cuda":
        if not cuda:
            raise ValueError("a CUDA cell needs its `cuda` version to know its wheels' local version")
        return Expectation(re.escape(cuda_tag(cuda)), f"+{cuda_tag(cuda)} (the CUDA {cuda} build)")
    return Expectation("cpu", "+cpu (the CPU build)")


def _plain(accelerator: str, cuda: str | None, ngc: str | None) -> Expectation:
    if ngc:
        return Expectation(rf"(?:{_ngc_local(ngc)})?", f"no local part or +nv{ngc} (NGC container {ngc})")
    return Expectation("", "no local part")


def _source(accelerator: str, cuda: str | None, ngc: str | None) -> Expectation:
    if ngc:
        return Expectation(rf"(?:(?:[0-9a-f]{{7,40}})(?:\.{_ngc_local(ngc)})?|{_ngc_local(ngc)})?",
                           f"no local part, +<commit>, +<commit>.nv{ngc} or +nv{ngc} (NGC container {ngc}, "
                           "built from source)", source_dev=True)
    return Expectation("", "no local part")


@dataclass(frozen=True)
class Scheme:
    """How a framework's builds mark themselves in __version__ (framework.yaml's `local_versions`)."""

    description: str    # what builds of this scheme report (the catalogue and errors quote it)
    rule: Callable[[str, str | None, str | None], Expectation]   # (accelerator, cuda, ngc release) -> local part


# contracts.frameworks refuses a `local_versions` that is not a key here when it loads a framework's row.
SCHEMES: dict[str, Scheme] = {
    TORCH: Scheme("`+cpu` / `+cu<CUDA>` on PyPI's wheels, `+<commit>.nvYY.MM` on NGC", _torch),
    PLAIN: Scheme("no local part; NGC's builds may add `+nvYY.MM`", _plain),
    # Built from the project's git tree on NGC (JAX): `<release>[.devYYYYMMDD][+<commit>[.nvYY.MM]]`;
    # PyPI's wheels are plain releases. NGC's exact spelling has not been seen here (no NGC pull), so
    # the NGC rule takes both forms jax's version.py can produce and NGC's usual nvYY.MM suffix.
    SOURCE: Scheme("plain releases from PyPI; on NGC a build from the project's tree: `.devN` of the release, "
                   "`+<commit>[.nvYY.MM]` or `+nvYY.MM`", _source),
}


def expectation(claim: str, *, scheme: str, accelerator: str, cuda: str | None,
                ngc: str | None) -> Expectation:
    """The local part a build of this cell must report next to `claim`."""
    local = split(claim)[1]
    if local:
        return Expectation(re.escape(local), f"+{local} (as claimed)")
    if scheme not in SCHEMES:
        raise ValueError(f"unknown version scheme {scheme!r}; one of {', '.join(SCHEMES)}")
    return SCHEMES[scheme].rule(accelerator, cuda, ngc)


def split(version: str) -> tuple[str, str]:
    """(public, local) of a version string as written: `2.9.0a0+50eac8.nv25.10` -> (`2.9.0a0`, `50eac8.nv25.10`)."""
    public, _, local = version.strip().partition("+")
    return public, local


def problems(actual: str, claim: str, expect: Expectation) -> list[str]:
    """Why `actual` (the image's `__version__`) does not satisfy `claim`; empty when it does."""
    found: list[str] = []
    try:
        have, want = Version(actual), Version(claim)
    except InvalidVersion as exc:
        return [f"not a PEP 440 version ({exc})"]
    from_tree = (expect.source_dev and have.is_devrelease and not want.is_devrelease and have.pre is None
                 and Version(have.base_version) == Version(want.public))
    if Version(have.public) != Version(want.public) and not from_tree:
        found.append(f"version {have.public} is not {want.public}")
    local = split(actual)[1]
    if not re.fullmatch(expect.local_pattern, local):
        shown = f"+{local}" if local else "no local part"
        found.append(f"build {shown} is not the cell's {expect.local_text}")
    return found
