"""pylock.toml texts as uv writes them (PEP 751), for tests that need a lock without resolving one."""

from __future__ import annotations

import hashlib

from buildtool.contracts.locks import Entry, File


def pylock(packages: dict[str, tuple[str, list[tuple[str, str]]]], tool: dict[str, str] | None = None) -> str:
    """name -> (version, [(wheel file name, sha256)]); `tool`: the [tool.dl-images] table (inputs, python,
    platform, glibc)."""
    text = 'lock-version = "1.0"\ncreated-by = "uv"\nrequires-python = ">=3.11"\n'
    for name, (version, wheels) in packages.items():
        listed = ", ".join(f'{{ url = "https://files.example/{w}", hashes = {{ sha256 = "{sha}" }} }}'
                           for w, sha in wheels)
        text += f'\n[[packages]]\nname = "{name}"\nversion = "{version}"\nwheels = [{listed}]\n'
    if tool:
        text += "\n[tool.dl-images]\n" + "".join(f'{key} = "{value}"\n' for key, value in tool.items())
    return text


def one_wheel(versions: dict[str, str]) -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Each name at its version with one py3 wheel whose sha256 is derived from both."""
    return {name: (version, [(f"{name.replace('-', '_')}-{version}-py3-none-any.whl",
                              hashlib.sha256(f"{name} {version}".encode()).hexdigest())])
            for name, version in versions.items()}


def from_entries(entries: dict[str, Entry], tool: dict[str, str]) -> str:
    """A pylock.toml of these parsed entries (their files as the lock they came from names them)."""
    def files(listed: tuple[File, ...]) -> str:
        return ", ".join(f'{{ url = "{f.url}", hashes = {{ sha256 = "{f.sha256}" }} }}' for f in listed)

    text = 'lock-version = "1.0"\ncreated-by = "uv"\nrequires-python = ">=3.11"\n'
    for name in sorted(entries):
        entry = entries[name]
        text += f'\n[[packages]]\nname = "{name}"\nversion = "{entry.version}"\n'
        text += f"sdist = {files((entry.sdist,))}\n" if entry.sdist else ""
        text += f"wheels = [{files(entry.wheels)}]\n" if entry.wheels else ""
    return text + "\n[tool.dl-images]\n" + "".join(f'{key} = "{value}"\n' for key, value in tool.items())
