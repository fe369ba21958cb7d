"""A probe result (image-tests/scripts/packages.py's JSON) shaped like a pytorch-cpu image's, small
enough to read: the SBOM tests build their documents from it."""

from __future__ import annotations

import copy
from typing import Any

from buildtool.contracts.locks import FRAMEWORK_LOCK as FRAMEWORK_LOCK_NAME
from buildtool.contracts.locks import TOOLS_LOCK as TOOLS_LOCK_NAME
from buildtool.contracts.locks import parse_lock
from tests.pylocks import pylock

ENVIRONMENT = {"implementation_name": "cpython", "implementation_version": "3.11.2", "os_name": "posix",
               "platform_machine": "x86_64", "platform_release": "6.1.0", "platform_system": "Linux",
               "platform_version": "#1 SMP", "python_full_version": "3.11.2",
               "platform_python_implementation": "CPython", "python_version": "3.11", "sys_platform": "linux"}


def _dist(version: str, *requires: str, expression: str = "", license: str = "",
          classifiers: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"version": version, "license_expression": expression, "license": license,
            "license_classifiers": list(classifiers), "requires_dist": list(requires)}


def _deb(name: str, version: str, arch: str, source: str = "", source_version: str = "", depends: str = "",
         pre_depends: str = "", provides: str = "", licenses: list[str] | None = None) -> dict[str, Any]:
    return {"Package": name, "Version": version, "Architecture": arch, "source:Package": source or name,
            "source:Version": source_version or version, "Depends": depends, "Pre-Depends": pre_depends,
            "Provides": provides, "licenses": licenses}


PYTHON = {
    "torch": _dist("2.13.0+cpu", "filelock", "sympy>=1.13.3", "typing-extensions>=4.10.0",
                   'triton==3.5.0; platform_system == "Linux" and platform_machine == "x86_64" and extra == "gpu"',
                   'opt-einsum>=3.3; extra == "opt-einsum"', expression="BSD-3-Clause"),
    "filelock": _dist("4.3.1", expression="Unlicense"),
    "sympy": _dist("1.14.0", "mpmath<1.4,>=1.1.0", 'pytest>=7.1.0; extra == "dev"', license="BSD",
                   classifiers=("BSD License",)),
    "mpmath": _dist("1.3.0", 'pytest>=4.6; extra == "develop"', classifiers=("BSD License",)),
    "typing-extensions": _dist("4.16.0"),
    "tensorboard": _dist("2.21.0", "werkzeug>=1.0.1", 'colorama; sys_platform == "win32"',
                         "markdown[extra]>=2.6.8", license="Apache 2.0"),
    "werkzeug": _dist("3.1.9", "markupsafe>=2.1.1"),
    "markupsafe": _dist("3.0.4", expression="BSD-3-Clause"),
    "markdown": _dist("3.11.3", 'pyyaml; extra == "extra"', 'pygments; extra == "never-asked"'),
    "pyyaml": _dist("6.0.3", license="MIT"),
}

DEBIAN = [
    _deb("bash", "5.2.15-2+b8", "amd64", source_version="5.2.15-2", pre_depends="libc6 (>= 2.36), libtinfo6 (>= 6)",
         depends="base-files (>= 2.1.12), debianutils (>= 5.6-0.1)", licenses=None),
    _deb("base-files", "12.4+deb12u12", "amd64", licenses=["GPL"]),
    _deb("debianutils", "5.7-0.5~deb12u1", "amd64", pre_depends="libc6 (>= 2.34)",
         licenses=["GPL-2+", "SMAIL-GPL"]),
    _deb("libc6", "2.36-9+deb12u10", "amd64", source="glibc", depends="libgcc-s1"),
    _deb("libgcc-s1", "12.2.0-14+deb12u1", "amd64", source="gcc-12", depends="gcc-12-base (= 12.2.0-14+deb12u1), "
         "libc6 (>= 2.35)"),
    _deb("gcc-12-base", "12.2.0-14+deb12u1", "amd64", source="gcc-12"),
    _deb("libtinfo6", "6.4-4", "amd64", source="ncurses", depends="libc6 (>= 2.34)"),
    _deb("debconf", "1.5.82", "all", provides="debconf-2.0", pre_depends="perl-base (>= 5.20.1-3~)",
         licenses=["BSD-2-clause"]),
    _deb("perl-base", "5.36.0-7+deb12u2", "amd64", source="perl", pre_depends="libc6 (>= 2.35), dpkg (>= 1.17.17)",
         provides="perlapi-5.36.0"),
    _deb("dpkg", "1.21.22", "amd64", depends="tar (>= 1.28-1)", pre_depends="libc6 (>= 2.34)"),
    _deb("tar", "1.34+dfsg-1.2+deb12u1", "amd64", pre_depends="libc6 (>= 2.34)"),
    _deb("ca-certificates", "20230311+deb12u1", "all", depends="openssl (>= 1.1.1), debconf (>= 0.5) | debconf-2.0",
         licenses=["GPL-2+", "MPL-2.0"]),
    _deb("openssl", "3.0.17-1~deb12u2", "amd64", depends="libc6 (>= 2.34), libssl3 (>= 3.0.9)"),
    _deb("libssl3", "3.0.17-1~deb12u2", "amd64", source="openssl", depends="libc6:any (>= 2.34)"),
]

PROBE: dict[str, Any] = {
    "python": "3.11.2", "os": "Debian GNU/Linux 12 (bookworm)", "arch": "x86_64", "cuda": "",
    "os_release": {"ID": "debian", "VERSION_ID": "12", "PRETTY_NAME": "Debian GNU/Linux 12 (bookworm)"},
    "python_packages": {name: d["version"] for name, d in sorted(PYTHON.items())},
    "apt_packages": {(f"{d['Package']}:amd64" if d["Package"].startswith("lib") else d["Package"]): d["Version"]
                     for d in DEBIAN},
    "python_details": dict(sorted(PYTHON.items())),
    "python_unnamed": [],
    "marker_environment": ENVIRONMENT,
    "deb_packages": sorted(DEBIAN, key=lambda d: d["Package"]),
}

TORCH_SHA = "a" * 64
MANY = "cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.manylinux_2_28_x86_64"


FRAMEWORK_LOCK = pylock({
    "torch": ("2.13.0+cpu", [("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", TORCH_SHA)]),
    "filelock": ("4.3.1", [("filelock-4.3.1-py3-none-any.whl", "b" * 64),
                           ("filelock-4.3.1-py2.py3-none-any.whl", "c" * 64)]),
    "sympy": ("1.14.0", [("sympy-1.14.0-py3-none-any.whl", "d" * 64)]),
    "mpmath": ("1.3.0", [("mpmath-1.3.0-py3-none-any.whl", "e" * 64)]),
    "typing-extensions": ("4.16.0", [("typing_extensions-4.16.0-py3-none-any.whl", "f" * 64)]),
})
TOOLS_LOCK = pylock({
    "tensorboard": ("2.21.0", [("tensorboard-2.21.0-py3-none-any.whl", "1" * 64)]),
    "werkzeug": ("3.1.9", [("werkzeug-3.1.9-py3-none-any.whl", "2" * 64)]),
    "markupsafe": ("3.0.4", [(f"markupsafe-3.0.4-{MANY}.whl", "3" * 64),
                             ("markupsafe-3.0.4-cp311-cp311-musllinux_1_2_x86_64.whl", "4" * 64),
                             ("markupsafe-3.0.4-py3-none-any.whl", "5" * 64)]),
    "markdown": ("3.11.3", [("markdown-3.11.3-py3-none-any.whl", "6" * 64)]),
})
LOCKS = {FRAMEWORK_LOCK_NAME: parse_lock(FRAMEWORK_LOCK), TOOLS_LOCK_NAME: parse_lock(TOOLS_LOCK)}


# The pytorch-cpu cell's indexes (sbom.make_sbom's `indexes`): PyPI, and PyTorch's CPU index its torch+cpu is from.
INDEXES = ("", "https://download.pytorch.org/whl/cpu")


def probe() -> dict[str, Any]:
    """A fresh copy, for tests that change it."""
    return copy.deepcopy(PROBE)


def probe_copy(found: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(found)


def set_python(found: dict[str, Any], name: str, version: str | None) -> None:
    """Install `name` at `version` in a probe result (None: remove it), in both places the probe lists it."""
    if version is None:
        del found["python_packages"][name], found["python_details"][name]
        return
    found["python_packages"][name] = version
    found["python_details"].setdefault(name, _dist(version))["version"] = version


def set_deb(found: dict[str, Any], name: str, version: str) -> None:
    """Change an installed Debian package's version (its source's version too)."""
    row = next(d for d in found["deb_packages"] if d["Package"] == name)
    row["Version"] = row["source:Version"] = version
    key = next(k for k in found["apt_packages"] if k.split(":")[0] == name)
    found["apt_packages"][key] = version


def minimal(python: dict[str, str], debs: dict[str, str]) -> dict[str, Any]:
    """A probe result with just these Python distributions and (amd64, self-sourced) Debian packages."""
    found = probe()
    found["python_packages"], found["python_details"] = {}, {}
    found["apt_packages"] = dict(sorted(debs.items()))
    found["deb_packages"] = [_deb(name, version, "amd64") for name, version in sorted(debs.items())]
    for name, version in python.items():
        set_python(found, name, version)
    return found
