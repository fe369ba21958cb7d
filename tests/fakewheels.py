"""Small pure-Python wheels for tests that install or resolve with real uv against a local index."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def fake_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] | list[str] = (),
               tag: str = "py3-none-any") -> tuple[str, str]:
    """A wheel of `name` `version` (with its Requires-Dist) in `folder`; (file name, sha256). Fixed
    member times, so the same arguments give the same bytes."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{module}/__init__.py": f"__version__ = {version!r}\n", f"{dist}/METADATA": meta,
             f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n"}
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(t)}" for p, t in files.items()]
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{module}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(zipfile.ZipInfo(member, (2020, 1, 1, 0, 0, 0)), text)
    return path.name, hashlib.sha256(path.read_bytes()).hexdigest()
