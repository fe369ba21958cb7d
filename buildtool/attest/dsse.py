"""DSSE envelopes signed with Ed25519 keys (https://github.com/secure-systems-lab/dsse).

An envelope is `{"payloadType", "payload" (base64), "signatures": [{"keyid", "sig"}]}`; the
signature covers the pre-authentication encoding PAE(payloadType, payload), so neither the
type nor the bytes can be swapped without breaking it. Keys are Ed25519 (the `cryptography`
package, imported only when a key is used), stored as PEM: PKCS#8 private keys, SubjectPublicKeyInfo
public keys, the formats cosign, openssl and securesystemslib read. A key id is the sha256 of
the raw 32-byte public key, hex: the same key always has the same id, whatever file holds it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildtool.common import strict_json


class EnvelopeError(ValueError):
    """An envelope or key that cannot be used; the message names why."""


@dataclass(frozen=True)
class PublicKey:
    keyid: str
    pem: str

    def verifies(self, payload_type: str, payload: bytes, signature: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        key = load_pem_public_key(self.pem.encode())
        try:
            key.verify(signature, pae(payload_type, payload))  # type: ignore[call-arg, union-attr]
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class PrivateKey:
    keyid: str
    pem: bytes = field(repr=False)     # the private key itself: never in a log line or a traceback

    def public(self) -> PublicKey:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_private_key

        key = load_pem_private_key(self.pem, password=None)
        pem = key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
        return PublicKey(self.keyid, pem)

    def sign(self, payload_type: str, payload: bytes) -> bytes:
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        key = load_pem_private_key(self.pem, password=None)
        return key.sign(pae(payload_type, payload))  # type: ignore[call-arg, union-attr]


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def _keyid(public_key: Any) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return hashlib.sha256(public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()


def generate() -> PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    return PrivateKey(_keyid(key.public_key()), pem)


def load_private(pem: bytes, where: str) -> PrivateKey:
    """An Ed25519 private key from PEM (PKCS#8); EnvelopeError naming `where` otherwise."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise EnvelopeError(f"{where} is not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise EnvelopeError(f"{where} is a {type(key).__name__}, not an Ed25519 key (make one with `buildtool keys`)")
    return PrivateKey(_keyid(key.public_key()), pem)


def load_public(pem: str, where: str) -> PublicKey:
    """An Ed25519 public key from PEM (SubjectPublicKeyInfo); EnvelopeError naming `where` otherwise."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    text = pem.strip()
    blocks = text.count("-----BEGIN ")
    # The PEM reader takes the first block and reads past the rest: a reviewer would see a key that is not trusted.
    if blocks > 1:
        raise EnvelopeError(f"{where} holds {blocks} PEM blocks, not one; give exactly one public key")
    if blocks == 1 and not (text.startswith("-----BEGIN ") and text.endswith("-----")):
        raise EnvelopeError(f"{where} holds text before or after its PEM block; give the public key's PEM only")
    try:
        key = load_pem_public_key(pem.encode())
    except (ValueError, TypeError) as exc:
        raise EnvelopeError(f"{where} is not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise EnvelopeError(f"{where} is a {type(key).__name__}, not an Ed25519 public key")
    return PublicKey(_keyid(key), pem)


def write_private(path: Path, key: PrivateKey) -> None:
    """Write a private key readable by its owner only (created 0600, never widened), whole or not at all: written
    beside `path` and linked into place, so no reader (a second validate making the dev key) meets half a key and a
    write that fails (a full disk, Ctrl-C) leaves none. FileExistsError where `path` exists: never replaced."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")   # mode 0600
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(key.pem)
        os.link(tmp, path)
    finally:
        os.unlink(tmp)


def sign_envelope(key: PrivateKey, payload_type: str, payload: bytes) -> dict[str, Any]:
    return {"payloadType": payload_type, "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": key.keyid, "sig": base64.b64encode(key.sign(payload_type, payload)).decode()}]}


# The most signatures under trusted key ids an envelope may carry: this toolkit's signers and Sigstore bundles write
# one; each costs a verification, so thousands of junk ones under a trusted key's id would cost a reader minutes.
MAX_SIGNATURES = 16
# DSSE envelope.md v1.0.0: "Either standard or URL-safe encoding is allowed", padded or not; one alphabet a string.
_STANDARD, _URL_SAFE = re.compile(r"[A-Za-z0-9+/]*={0,2}"), re.compile(r"[A-Za-z0-9_-]*={0,2}")


def b64decode(text: str) -> bytes:
    """A DSSE payload or signature: standard or URL-safe base64, padded or not; ValueError for anything else (both
    alphabets in one string, wrong padding)."""
    alphabet = None if _STANDARD.fullmatch(text) else b"-_" if _URL_SAFE.fullmatch(text) else ""
    if alphabet == "":
        raise ValueError("neither standard nor URL-safe base64")
    return base64.b64decode(text if "=" in text else text + "=" * (-len(text) % 4), altchars=alphabet, validate=True)


def canonical(envelope: dict[str, Any]) -> dict[str, Any]:
    """The envelope with its payload and signatures in padded standard base64 where they decode, each signature entry
    as open_envelope reads it (its key id, "" where missing or null; its sig; nothing else) and once: one signed
    envelope has one text, whichever encoding (or repetition) carried it. An entry is its key id and sig together,
    never its sig alone: entries that verify alike are one, and no two texts that verify differently."""
    def standard(value: Any) -> Any:
        try:
            return base64.b64encode(b64decode(value)).decode() if isinstance(value, str) else value
        except ValueError:
            return value

    out = {**envelope, **({"payload": standard(envelope["payload"])} if "payload" in envelope else {})}
    if isinstance(signatures := envelope.get("signatures"), list):
        texts = (json.dumps({"keyid": str(s.get("keyid") or ""), "sig": standard(str(s.get("sig") or ""))}
                            if isinstance(s, dict) else s, sort_keys=True) for s in signatures)
        out["signatures"] = [json.loads(text) for text in dict.fromkeys(texts)]
    return out


@dataclass(frozen=True)
class Opened:
    """What a verified envelope says, and who signed it."""

    payload_type: str
    payload: bytes
    keyid: str


def open_envelope(data: bytes, trusted: dict[str, PublicKey]) -> Opened:
    """Verify an envelope against trusted keys (keyid -> key); EnvelopeError naming the cause:
    not an envelope, unsigned, signed only by untrusted keys, or a signature that does not verify."""
    try:
        envelope = strict_json.loads(data)
    except strict_json.RepeatedKey as exc:
        raise EnvelopeError(f"malformed: the DSSE envelope repeats the key {exc} in one JSON object (JSON readers "
                            "disagree on which one counts)") from None
    except ValueError:
        raise EnvelopeError("unsigned: not a DSSE envelope (not JSON)") from None
    if not isinstance(envelope, dict) or not {"payloadType", "payload"} <= set(envelope):
        raise EnvelopeError("unsigned: not a DSSE envelope (no payloadType/payload)")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or not signatures:
        raise EnvelopeError("unsigned: the envelope carries no signature")
    claimed = sum(isinstance(e, dict) and str(e.get("keyid") or "") in trusted for e in signatures)
    if claimed > MAX_SIGNATURES:     # each costs a verification; an untrusted key id's costs nothing
        raise EnvelopeError(f"malformed: the envelope carries {claimed} signatures under trusted key ids, more than "
                            f"the {MAX_SIGNATURES} a DSSE envelope of this toolkit's signers may carry")
    try:
        payload = b64decode(str(envelope["payload"]))
    except ValueError:
        raise EnvelopeError("malformed: the payload is neither standard nor URL-safe base64") from None
    payload_type = str(envelope["payloadType"])
    untrusted, bad = [], []
    for entry in signatures:
        keyid = str((entry or {}).get("keyid") or "") if isinstance(entry, dict) else ""
        key = trusted.get(keyid)
        if key is None:
            untrusted.append(keyid or "(no key id)")
            continue
        try:
            sig = b64decode(str(entry.get("sig") or ""))
        except ValueError:
            bad.append(keyid)
            continue
        if key.verifies(payload_type, payload, sig):
            return Opened(payload_type, payload, keyid)
        bad.append(keyid)
    if bad:
        raise EnvelopeError(f"wrongly signed: the signature of trusted key {short(bad[0])} does not verify "
                            "(payload tampered with, or signed by another key under that id)")
    named = list(dict.fromkeys(untrusted))     # each signer once, three shown: anyone may push many signatures
    more = f" and {len(named) - 3} more" if len(named) > 3 else ""
    raise EnvelopeError(f"untrusted key: signed by {', '.join(short(k) for k in named[:3])}{more}, "
                        "which is not a trusted key")


def claimed_keyids(data: bytes) -> list[str]:
    """The key ids an envelope claims to be signed by, unverified: only to say why a signature does not
    count (a key trusted in another role), never to trust anything. Read as open_envelope reads it: an envelope
    that repeats a key claims nothing (its refusal names the key, not the role of a signer only one reading sees)."""
    try:
        signatures = strict_json.loads(data).get("signatures")
    except (ValueError, AttributeError):
        return []
    return [str(s.get("keyid")) for s in signatures if isinstance(s, dict)] if isinstance(signatures, list) else []


def short(keyid: str) -> str:
    """A key id as messages show it: its first 16 characters, escaped where an envelope anyone may push names one that
    would break the line or drive the terminal."""
    return keyid[:16] if keyid[:16].isprintable() else ascii(keyid[:16])
