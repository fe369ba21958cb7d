"""Which key signs attestations here, and which keys release trusts for what (docs/release-trust.md#keys; the
format of config/trusted-keys.yaml is in its opening comment).

Two roles sign (ROLES): the builder what it built (the provenance and the SBOM attestation, at push), the tester
what it validated (the verdict), each with the private key in its variable (KEY_ENV: PEM text or a path, a CI
secret), else with this user's local development key, created on first use so that the README's first command
works on a fresh machine. What the dev key signs is signed, but by nobody release trusts: release accepts it (in
both roles) only with `--trust-local-key`, and only for a loopback registry, never through the trusted keys file.

Each key of that file is trusted only in the roles its entry lists (no default: an entry without roles is refused,
naming it): a build job's key that leaked into a pull request cannot vouch that an image passed. A key in both roles
lets one party build an image and vouch for its tests: an entry lists both only with `allow_both_roles: true`
beside them (a reviewer sees that it is meant), and verify says so when one key signed both.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from buildtool.attest.dsse import EnvelopeError, PrivateKey, PublicKey, generate, load_private, load_public, short
from buildtool.attest.dsse import write_private as _write_private
from buildtool.attest.trust import BUILDER as BUILDER  # the roles, re-exported for validate's callers
from buildtool.attest.trust import ROLES as ROLES
from buildtool.attest.trust import TESTER as TESTER
from buildtool.attest.verdict_statement import BUILDER_KEY_ENV, SIGNING_KEY_ENV, TRUSTED_KEYS_FILE, dev_key_path
from buildtool.common.errors import UserError

KEY_ENV = {TESTER: SIGNING_KEY_ENV, BUILDER: BUILDER_KEY_ENV}   # the CI secret each role signs with


@dataclass(frozen=True)
class SigningKey:
    key: PrivateKey
    source: str          # where it came from, for messages
    dev: bool            # the local development key


def signing_key(log: Callable[[str], None], create_dev: bool = True, role: str = TESTER) -> SigningKey:
    """The key `role` signs with: its variable (KEY_ENV), else the local dev key (created when missing)."""
    if role not in KEY_ENV:
        raise ValueError(f"unknown signing role {role!r} (roles: {', '.join(ROLES)})")
    env = KEY_ENV[role]
    value = os.environ.get(env, "").strip()
    if value:
        if value.startswith("-----BEGIN"):
            pem, where = value.encode(), f"${env}"
        else:
            try:
                path = Path(value).expanduser()
            except RuntimeError:     # ~user of a user this machine does not have: a file that cannot be read
                path = Path(value)
            try:
                pem = path.read_bytes()
            except OSError as exc:
                what = (f"names {path}, which cannot be read" if _plainly_a_path(value, path) else
                        "is neither PEM text nor a file that can be read (its value is not shown: it may be the key "
                        "itself, quoted or encoded)")
                raise UserError(f"${env} {what} ({exc.strerror}); set it to the PEM text (starting -----BEGIN) or a "
                                "readable file") from None
            where = f"{path} (${env})"
        try:
            return SigningKey(load_private(pem, where), where, dev=False)
        except EnvelopeError as exc:
            raise UserError(str(exc)) from None
    path = dev_key_path()
    if not path.is_file():
        if not create_dev:
            raise UserError(f"no signing key: set ${env} or create the local dev key with "
                            "`buildtool keys --dev`")
        key = generate()
        try:
            _write_private(path, key)
        except FileExistsError:
            pass   # another validate made it at the same moment: use that one
        except OSError as exc:   # a config home through a file, read-only, or a full disk
            raise UserError(f"cannot create the local dev signing key {path} ({exc.strerror or exc}): set "
                            f"XDG_CONFIG_HOME to a folder this user can write, or set ${env} to a key") from None
        else:
            log(f"created the local dev signing key {path} (key {short(key.keyid)}); verdicts it signs are "
                "trusted by release only with --trust-local-key on a loopback registry. CI signs verdicts "
                f"with ${SIGNING_KEY_ENV} and builds with ${BUILDER_KEY_ENV} (see `buildtool keys`)")
    try:
        return SigningKey(load_private(path.read_bytes(), str(path)), f"local dev key {path}", dev=True)
    except EnvelopeError as exc:
        raise UserError(f"{exc}; remove it to have a new dev key made") from None


def _plainly_a_path(value: str, path: Path) -> bool:
    """Whether a signing key variable's value that is no PEM text is plainly `path` and may be shown: a value that
    may be the key itself (PEM in quotes, base64, one line of key material) is never echoed. Base64 may hold one
    `/` anywhere, the first included: a file right under `/` is plainly a path only when its name has a `.`, which
    base64 never has."""
    return ("/" in value and "-----" not in value and not any(c.isspace() or c in "\"'" for c in value)
            and path.parent.is_dir() and (path.parent != Path(path.anchor) or "." in path.name))


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
    """The keys release trusts, by role; a buildtool.attest.trust.Trusted (what registry readers take)."""

    keys: dict[str, PublicKey] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    source: str = TRUSTED_KEYS_FILE
    dev: set[str] = field(default_factory=set)        # key ids trusted only as this machine's dev key
    roles: dict[str, frozenset[str]] = field(default_factory=dict)   # key id -> the ROLES it is trusted in
    # This machine's dev key where --trust-local-key would trust it (a loopback registry) but it is not trusted:
    # a refusal of what it signed names it and the flag (`untrusted_hint`).
    offered_dev: str = ""

    def describe(self, keyid: str) -> str:
        name = self.names.get(keyid, "")
        return f"{short(keyid)} ({name})" if name else short(keyid)

    def add_dev(self, key: PublicKey) -> None:
        self.keys.setdefault(key.keyid, key)
        self.names.setdefault(key.keyid, "local dev key")
        self.roles.setdefault(key.keyid, frozenset(ROLES))    # a developer builds and tests
        self.dev.add(key.keyid)

    def offer_dev(self, key: PublicKey | None) -> None:
        """Name this machine's dev key `key` in the refusals of what it signed: only where --trust-local-key would
        cure them (the caller has checked the registry is a loopback one)."""
        if key is not None and key.keyid not in self.keys:
            self.offered_dev = key.keyid

    def untrusted_hint(self, keyid: str) -> str:
        """The refusal of a signature by `keyid` when it is the dev key offered (offer_dev), "" otherwise."""
        if not keyid or keyid != self.offered_dev or keyid in self.keys:
            return ""
        return (f"untrusted key: signed by this machine's dev key {short(keyid)}, which is not a trusted key; on a "
                "loopback registry pass --trust-local-key")

    def for_role(self, role: str) -> dict[str, PublicKey]:
        """The keys trusted in `role` (keyid -> key): what an envelope of that role is opened against."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r} (roles: {', '.join(ROLES)})")
        return {k: key for k, key in self.keys.items() if role in self.roles.get(k, frozenset())}

    def role_problem(self, keyid: str, role: str) -> str:
        """Why a signature by `keyid` does not count in `role` ("" when it does): untrusted, or trusted
        only in another role (a builder key signing a verdict)."""
        if keyid not in self.keys:
            return f"signed by {short(keyid)}, which is not a trusted key"
        held = self.roles.get(keyid, frozenset())
        if role in held:
            return ""
        return (f"signed by {self.describe(keyid)}, trusted as {', '.join(sorted(held)) or 'nothing'}, not as {role} "
                f"({self.source} lists the roles each key is trusted in)")


_ENTRY_FIELDS = ("name", "roles", "public_key", "allow_both_roles")
# A name that says the key is a developer's own (`local dev key`, `alice-dev`, `dev-signing-key`).
_DEV_NAME = re.compile(r"(?i)(?:^|[^a-z0-9])dev(?:[^a-z0-9]|$)")


def is_dev_name(name: str) -> bool:
    """Whether a key's name says it is a dev key (`dev`, `ci-dev`): never an entry of the trusted-keys file."""
    return bool(_DEV_NAME.search(name))


def load_trusted(root: Path, path: Path | None = None) -> TrustedKeys:
    """The repository's trusted keys; a missing file trusts nobody, anything else not exactly a list
    of {name, public_key} is bad input naming its line (read with the matrix's duplicate-refusing,
    line-tracking loader: a second `keys:` is not silently the one that counts). Refused too: one
    public key under two entries (removing one would leave it trusted), and the local dev key, by
    its key or by an entry that says it is one: dev-signed verdicts are trusted only with
    --trust-local-key on a loopback registry, never through this file."""
    from buildtool.common.errors import MatrixError
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
            raise bad(line, f"keys[{i}] ({name}) has unknown field {', '.join(unknown)}; an entry has only name, "
                            "roles, public_key and allow_both_roles")
        roles = entry.get("roles")
        if not isinstance(roles, list) or not roles or not all(isinstance(r, str) for r in roles):
            raise bad(line, f"keys[{i}] ({name}) needs `roles:`, a list of {' and/or '.join(ROLES)} (what the key "
                            "is trusted to sign: builder for provenance and SBOMs, tester for verdicts)")
        wrong = sorted(set(roles) - set(ROLES))
        if wrong:
            raise bad(line, f"keys[{i}] ({name}) has unknown role {', '.join(wrong)}; roles are "
                            f"{' and '.join(ROLES)}")
        both = entry.get("allow_both_roles", False)
        if not isinstance(both, bool):
            raise bad(line, f"keys[{i}] ({name}): allow_both_roles is {both!r}, not true or false")
        if set(roles) >= set(ROLES) and both is not True:
            raise bad(line, f"keys[{i}] ({name}) is trusted as both {' and '.join(ROLES)}: one key would then build an "
                            "image and vouch for its tests on its own; give each role its own key, or say it is "
                            "meant with `allow_both_roles: true` in this entry")
        if is_dev_name(name):
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
        trusted.roles[key.keyid] = frozenset(roles)
    return trusted


def trusted_entry(name: str, key: PublicKey, roles: tuple[str, ...] = (TESTER,)) -> str:
    """The YAML lines that add `key` to the trusted keys file, trusted in `roles`; the name quoted where YAML would
    read it as no text (2026, null, yes)."""
    import json

    from buildtool.common.errors import MatrixError
    from buildtool.matrix.yamlsource import parse_yaml

    try:
        plain = parse_yaml(f"name: {name}\n", "--name").data == {"name": name}
    except MatrixError:
        plain = False
    name = name if plain else json.dumps(name)
    body = "\n".join(f"      {line}" for line in key.pem.strip().splitlines())
    both = "    allow_both_roles: true\n" if set(roles) >= set(ROLES) else ""
    return (f"  - name: {name}\n    # key id {key.keyid}\n    roles: [{', '.join(roles)}]\n{both}"
            f"    public_key: |\n{body}\n")


def cache_trust(root: Path, own: PublicKey | None, loopback: bool) -> TrustedKeys:
    """Whose dev images a build may take layers from (buildtool.imagebuild.cache_sources): the builder keys of
    the trusted keys file, the key this build signs with, and this machine's dev key only for a loopback
    registry (as release trusts it). A tester key is not enough: it never vouched for how a layer was made."""
    trusted = load_trusted(root)
    builders = trusted.for_role(BUILDER)
    kept = TrustedKeys(keys=builders, names={k: trusted.names[k] for k in builders}, source=trusted.source,
                       roles={k: frozenset({BUILDER}) for k in builders})
    if own is not None and own.keyid not in kept.keys:
        kept.keys[own.keyid] = own
        kept.names[own.keyid] = "this build's builder key"
        kept.roles[own.keyid] = frozenset({BUILDER})
    dev = dev_public_key() if loopback else None
    if dev is not None and dev.keyid not in kept.keys:
        kept.add_dev(dev)
    return kept
