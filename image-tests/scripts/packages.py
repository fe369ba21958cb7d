"""Print what the image contains as one JSON object on stdout: Python distributions (PEP 503
names -> versions, the first on sys.path wins, as for an import), Debian packages, Python
version, OS, CUDA. Standard library only; one exec per image (image-tests and the SBOM step).
For the SBOM also what the packages' own metadata says: each distribution's license fields
and Requires-Dist with the image's marker environment (evaluated by buildtool, which has
`packaging`), each Debian package's architecture, source package, Depends/Pre-Depends/Provides
and the license short names of a machine-readable (DEP-5) copyright file.
The build runs this file's text with `python -c` (the image tests list packages through testinfra's `host`)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import subprocess
import sys


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def python_packages() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            # The first one on sys.path wins, as it does for an import.
            found.setdefault(_norm(name), dist.version)
    return dict(sorted(found.items()))


def apt_packages() -> dict[str, str]:
    if not shutil.which("dpkg-query"):
        return {}
    run = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${binary:Package}\t${Version}\n"],
                         capture_output=True, text=True, timeout=60)
    found = {}
    for line in run.stdout.splitlines():
        status, name, version = (line.split("\t") + ["", ""])[:3]
        if status[1:2] == "i":   # installed, whatever is wanted of it (`hi`: on hold)
            found[name] = version
    return dict(sorted(found.items()))


def python_details() -> dict[str, dict[str, object]]:
    """License fields and Requires-Dist of the distributions python_packages lists."""
    found: dict[str, dict[str, object]] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if not name or _norm(name) in found:
            continue
        meta = dist.metadata
        license_field = (meta.get("License") or "").strip()
        found[_norm(name)] = {
            "version": dist.version,
            "license_expression": (meta.get("License-Expression") or "").strip(),
            # A one-line License field is a name; a longer one is the license's text, left out.
            "license": license_field if "\n" not in license_field and len(license_field) <= 120 else "",
            # `License :: Public Domain` names one; `License :: OSI Approved` (alone) and `DFSG approved` none.
            "license_classifiers": sorted({c.split("::")[-1].strip() for c in meta.get_all("Classifier") or []
                                           if c.startswith("License ::")} - {"", "OSI Approved", "DFSG approved"}),
            "requires_dist": list(dist.requires or []),
            # Which of the lock's files was installed: the wheel with exactly these tags.
            "wheel_tags": sorted(line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
                                 if line.startswith("Tag:")),
        }
    return dict(sorted(found.items()))


def python_unnamed() -> list[str]:
    """The metadata folders of distributions whose METADATA names none (the lists above cannot hold them)."""
    return sorted(str(getattr(dist, "_path", "") or dist.locate_file("")) for dist in md.distributions()
                  if not dist.metadata["Name"])


def marker_environment() -> dict[str, str]:
    """PEP 508's marker variables as this interpreter sees them (packaging's default_environment)."""
    impl = sys.implementation.version
    impl_version = f"{impl.major}.{impl.minor}.{impl.micro}"
    if impl.releaselevel != "final":
        impl_version += impl.releaselevel[0] + str(impl.serial)
    return {"implementation_name": sys.implementation.name, "implementation_version": impl_version,
            "os_name": os.name, "platform_machine": platform.machine(), "platform_release": platform.release(),
            "platform_system": platform.system(), "platform_version": platform.version(),
            "python_full_version": platform.python_version(),
            "platform_python_implementation": platform.python_implementation(),
            "python_version": ".".join(platform.python_version_tuple()[:2]), "sys_platform": sys.platform}


_DEB_FIELDS = ("Package", "Version", "Architecture", "source:Package", "source:Version", "Depends", "Pre-Depends",
               "Provides")
_COPYRIGHT_LIMIT = 16 << 20     # characters; Debian's largest copyright files are a few MB
_DEP5 = re.compile(r"^https?://www\.debian\.org/doc/packaging-manuals/copyright-format/1\.0/?$")


def deb_packages() -> list[dict[str, object]]:
    """Every installed Debian package with its architecture, source package, relations and licenses."""
    if not shutil.which("dpkg-query"):
        return []
    fmt = "${db:Status-Abbrev}\t" + "\t".join("${" + f + "}" for f in _DEB_FIELDS) + "\n"
    run = subprocess.run(["dpkg-query", "-W", "-f", fmt], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        raise RuntimeError(f"dpkg-query failed: {run.stderr.strip()[:200]}")
    found = []
    for line in run.stdout.splitlines():
        status, *values = line.split("\t")
        if len(values) != len(_DEB_FIELDS):    # zip(strict=) needs 3.10; images may have an older Python
            raise RuntimeError(f"dpkg-query gave {len(values)} fields, not {len(_DEB_FIELDS)}: {line[:120]!r}")
        if status[1:2] == "i":   # installed, whatever is wanted of it (`hi`: on hold)
            row: dict[str, object] = dict(zip(_DEB_FIELDS, values))  # noqa: B905 - lengths checked above
            row["licenses"] = dep5_licenses(f"/usr/share/doc/{row['Package']}/copyright")
            found.append(row)
    return sorted(found, key=lambda r: (str(r["Package"]), str(r["Architecture"])))


def dep5_licenses(path: str) -> list[str] | None:
    """License short names of a machine-readable copyright file (its header and Files paragraphs);
    None when there is no regular file, it is over _COPYRIGHT_LIMIT, or it is not in that format (free text says
    nothing parseable)."""
    if not os.path.isfile(path):    # an image's FIFO would block the probe, a link to /dev/zero never end
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read(_COPYRIGHT_LIMIT + 1)
    except OSError:
        return None
    if len(text) > _COPYRIGHT_LIMIT:
        return None
    paragraphs = [p for p in re.split(r"\n[ \t]*\n", text.strip()) if p.strip()]
    if not paragraphs:
        return None
    fields = [_fields(p) for p in paragraphs]
    if not _DEP5.match(fields[0].get("format", "")):
        return None
    if any("files" in f and not f.get("license") for f in fields[1:]):   # DEP-5 requires one: the file is broken
        return None
    names = {f["license"] for i, f in enumerate(fields) if f.get("license") and (i == 0 or "files" in f)}
    return sorted(names)


def _fields(paragraph: str) -> dict[str, str]:
    """First lines of a deb822 paragraph's fields, by lower-case name."""
    out: dict[str, str] = {}
    for line in paragraph.splitlines():
        if line and not line[0].isspace() and ":" in line and not line.startswith("#"):
            key, _, value = line.partition(":")
            out[key.strip().lower()] = value.strip()
    return out


def os_release() -> dict[str, str]:
    try:
        with open("/etc/os-release") as handle:
            text = handle.read()
    except OSError:
        return {}
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("ID", "VERSION_ID", "PRETTY_NAME"):
            found[key.strip()] = value.strip().strip("\"'")
    return found


def main() -> int:
    release = os_release()
    out = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "os": release.get("PRETTY_NAME", ""),
        "os_release": release,
        "arch": platform.machine(),
        "cuda": os.environ.get("CUDA_VERSION", ""),
        "python_packages": python_packages(),
        "apt_packages": apt_packages(),
        "python_details": python_details(),
        "python_unnamed": python_unnamed(),
        "marker_environment": marker_environment(),
        "deb_packages": deb_packages(),
    }
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
