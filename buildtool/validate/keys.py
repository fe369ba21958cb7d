"""Which key signs verdicts here, and which keys release trusts.

Signing (validate): the private key in DL_IMAGES_SIGNING_KEY (PEM text, or a path to a PEM
file: a CI secret of the validating runners), else this user's local development key
(~/.config/dl-images/dev-signing-key.pem), created on first use so that the README's first
command works on a fresh machine. A verdict signed by the dev key is a signed verdict, but
of nobody release trusts: release accepts it only with `--trust-local-key`, and only for a
loopback registry.

Trust (release): config/trusted-keys.yaml in the repository, a reviewed list of public keys:

    keys:
      - name: gpu-runners-2026          # who holds the private key
        public_key: |
          -----BEGIN PUBLIC KEY-----
          ...
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from buildtool.common.dsse import EnvelopeError, PrivateKey, PublicKey, generate, load_private, load_public, short
from buildtool.common.dsse import write_private as _write_private
from buildtool.common.errors import UserError
from buildtool.contracts.attestation import SIGNING_KEY_ENV, TRUSTED_KEYS_FILE, dev_key_path


@dataclass(frozen=True)
class SigningKey:
    key: PrivateKey
    source: str          # where it came from, for messages
    dev: bool            # the local development key


def signing_key(log: Callable[[str], None], create_dev: bool = True) -> SigningKey:
    """The key validate signs with: DL_IMAGES_SIGNING_KEY, else the local dev key (created when missing)."""
    value = os.environ.get(SIGNING_KEY_ENV, "").strip()
    if value:
        if value.startswith("-----BEGIN"):
            pem, where = value.encode(), f"${SIGNING_KEY_ENV}"
        else:
            path = Path(value).expanduser()
            try:
                pem = path.read_bytes()
            except OSError as exc:
                raise UserError(f"${SIGNING_KEY_ENV} names {path}, which cannot be read ({exc.strerror}); "
                                "set it to the PEM text or a readable file") from None
            where = f"{path} (${SIGNING_KEY_ENV})"
        try:
            return SigningKey(load_private(pem, where), where, dev=False)
        except EnvelopeError as exc:
            raise UserError(str(exc)) from None
    path = dev_key_path()
    if not path.is_file():
        if not create_dev:
            raise UserError(f"no signing key: set ${SIGNING_KEY_ENV} or create the local dev key with "
                            "`buildtool keys --dev`")
        key = generate()
        try:
            _write_private(path, key)
        except FileExistsError:
            pass   # another validate made it at the same moment: use that one
        else:
            log(f"created the local dev signing key {path} (key {short(key.keyid)}); verdicts it signs are "
                "trusted by release only with --trust-local-key on a loopback registry. CI signs with "
                f"${SIGNING_KEY_ENV} (see `buildtool keys`)")
    try:
        return SigningKey(load_private(path.read_bytes(), str(path)), f"local dev key {path}", dev=True)
    except EnvelopeError as exc:
        raise UserError(f"{exc}; remove it to have a new dev key made") from None


def dev_public_key() -> PublicKey | None:
    """The local dev key's public half, or None when this machine has none."""
    path = dev_key_path()
    if not path.is_file():
        return None
    try:
        return load_private(path.read_bytes(), str(path)).public()
    except EnvelopeError as exc:
        raise UserError(str(exc)) from None


@dataclass
class TrustedKeys:
    keys: dict[str, PublicKey] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    source: str = TRUSTED_KEYS_FILE
    dev: set[str] = field(default_factory=set)        # key ids trusted only as this machine's dev key

    def describe(self, keyid: str) -> str:
        name = self.names.get(keyid, "")
        return f"{short(keyid)} ({name})" if name else short(keyid)

    def add_dev(self, key: PublicKey) -> None:
        self.keys.setdefault(key.keyid, key)
        self.names.setdefault(key.keyid, "local dev key")
        self.dev.add(key.keyid)


_ENTRY_FIELDS = ("name", "public_key")
# A name that says the key is a developer's own (`local dev key`, `alice-dev`, `dev-signing-key`).
_DEV_NAME = re.compile(r"(?i)(?:^|[^a-z0-9])dev(?:[^a-z0-9]|$)")


def load_trusted(root: Path, path: Path | None = None) -> TrustedKeys:
    """The repository's trusted keys; a missing file trusts nobody, anything else not exactly a list
    of {name, public_key} is bad input naming its line (read with the matrix's duplicate-refusing,
    line-tracking loader: a second `keys:` is not silently the one that counts). Refused too: one
    public key under two entries (removing one would leave it trusted), and the local dev key, by
    its key or by an entry that says it is one: dev-signed verdicts are trusted only with
    --trust-local-key on a loopback registry, never through this file."""
    from buildtool.common.errors import MatrixError
    from buildtool.contracts.attestation import dev_key_path
    from buildtool.matrix.yamlsource import load_yaml

    path = path or root / TRUSTED_KEYS_FILE
    shown = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    trusted = TrustedKeys(source=shown)
    if not path.is_file():
        return trusted
    try:
        doc = load_yaml(path, shown)
    except MatrixError as exc:
        raise UserError(str(exc).replace("declare `images:`", "declare `keys:`")) from None

    def bad(line: int | None, message: str) -> UserError:
        return UserError(f"{shown}:{line}: {message}" if line else f"{shown}: {message}")

    data = doc.data
    entries = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(entries, list) or set(data) != {"keys"}:
        raise bad(doc.line_of(()), "expected only `keys:` with a list of {name, public_key}")
    dev = dev_public_key()
    seen: dict[str, tuple[str, int | None]] = {}
    for i, entry in enumerate(entries):
        line = doc.line_of(("keys", i))
        if not isinstance(entry, dict) or not isinstance(entry.get("public_key"), str) \
                or not isinstance(entry.get("name"), str) or not entry["name"].strip():
            raise bad(line, f"keys[{i}] needs name and public_key (PEM)")
        name = entry["name"]
        if "dev" in entry:
            raise bad(line, f"keys[{i}] ({name}) says it is a dev key (it has a `dev` field); a dev key is never "
                            "listed here: release trusts it only with --trust-local-key on a loopback registry")
        unknown = sorted(set(entry) - set(_ENTRY_FIELDS))
        if unknown:
            raise bad(line, f"keys[{i}] ({name}) has unknown field {', '.join(unknown)}; an entry has only name "
                            "and public_key")
        if _DEV_NAME.search(name):
            raise bad(line, f"keys[{i}] ({name}): its name says it is a dev key; a dev key is never listed here "
                            "(release trusts it only with --trust-local-key on a loopback registry); give a CI key "
                            "its runners' name")
        try:
            key = load_public(entry["public_key"], f"{shown}:{line} keys[{i}]")
        except EnvelopeError as exc:
            raise UserError(str(exc)) from None
        if dev is not None and key.keyid == dev.keyid:
            raise bad(line, f"keys[{i}] ({name}) is this machine's local dev key {dev_key_path()} (key "
                            f"{short(key.keyid)}); it is never listed here: release trusts it only with "
                            "--trust-local-key on a loopback registry")
        if key.keyid in seen:
            first, first_line = seen[key.keyid]
            raise bad(line, f"public key {short(key.keyid)} is listed twice: {first} (line {first_line}) and "
                            f"{name} (line {line}); list each key once (removing one entry would leave it trusted)")
        seen[key.keyid] = (name, line)
        trusted.keys[key.keyid] = key
        trusted.names[key.keyid] = name
    return trusted


def trusted_entry(name: str, key: PublicKey) -> str:
    """The YAML lines that add `key` to the trusted keys file."""
    body = "\n".join(f"      {line}" for line in key.pem.strip().splitlines())
    return f"  - name: {name}\n    # key id {key.keyid}\n    public_key: |\n{body}\n"
