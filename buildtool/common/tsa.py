"""RFC 3161 timestamps from a timestamp authority the user names (issue 52), for Sigstore bundles.

Optional on both sides, and nothing changes without them:
- a writer with TSA_URL_ENV set (`--tsa URL` on `buildtool build` and `validate`) asks that authority for a
  timestamp over each bundle's signature (the raw DSSE signature bytes: what sigstore-js and sigstore-python
  hash, `entity.signature.signature`), checks the answer (granted, our nonce, our digest) and puts the whole
  TimeStampResp, DER, in the bundle's `timestampVerificationData.rfc3161Timestamps[].signedTimestamp`
  (protobuf-specs: "the DER encoded TimeStampResponse");
- a reader with TSA_CERTS_ENV set (a PEM file: the authority's signing certificate first, then its
  intermediates and root) verifies every timestamp a bundle carries against it, and refuses a bundle that carries
  none (as sigstore-js with the authority trusted does); without it a bundle that carries one is refused
  (buildtool.attest.sigstore_bundle), as before.
Requests and verification are rfc3161-client's (the library sigstore-python uses), not hand-written ASN.1.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from buildtool.common.errors import FailedError, UserError

TSA_URL_ENV = "DL_IMAGES_TSA_URL"
TSA_CERTS_ENV = "DL_IMAGES_TSA_CERTS"
TIMEOUT_S = 30
QUERY_TYPE = "application/timestamp-query"


def url_problem(url: str) -> str:
    """Why `url` names no timestamp authority ("" when it does): an http(s) URL with a host, no credentials.
    The value itself is not in the message (it may hold a secret): the caller shows it (refs.shown)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        host = None
    if host is None or parts.scheme not in ("http", "https") or not url.isascii() or any(c.isspace() for c in url):
        return "is not an http(s) URL of a timestamp authority (e.g. https://tsa.example/tsr)"
    # An `@` past the scheme is userinfo, as shown_url reads it: a password with an unescaped `/`, `?` or `#`
    # (`https://user:abc/def==@host`) ends the authority early for a URL parser, which reads host `user`.
    if parts.username or parts.password or "@" in url.partition("://")[2]:
        return "carries credentials: name the timestamp authority without them"
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535: requests refused it only after the build, at signing
        port = 0
    if port == 0:  # port 0 connects nowhere
        return "has a bad port: name a port from 1 to 65535, or none (e.g. https://tsa.example:8443/tsr)"
    return ""


def _setting(name: str, example: str) -> str:
    """The variable `name` as every reader takes it, stripped: "" when unset or empty (as click reads an option's
    variable); only white space is refused naming it (fail closed: a value was meant, and none was given)."""
    value = os.environ.get(name, "")
    if value and not value.strip():
        raise UserError(f"{name} is set to white space only: name {example}, or unset it")
    return value.strip()


def configured_url() -> str:
    """TSA_URL_ENV ("" when unset or empty); UserError naming the variable when it is not a TSA URL. The one reader
    of the variable: `--tsa` does not read it (buildtool.cli.options), so the two cannot take it differently."""
    from buildtool.common.refs import shown
    from buildtool.common.urls import shown_url

    url = _setting(TSA_URL_ENV, "a timestamp authority's URL (e.g. https://tsa.example/tsr)")
    problem = url_problem(url) if url else ""
    if problem:
        raise UserError(f"{TSA_URL_ENV}: {shown(shown_url(url))} {problem}")
    return url


def check_writer(option: str | None, writes: bool = False) -> None:
    """Before a command that writes bundles does anything: the authority it will ask, `--tsa` (`option`, checked as
    an argument) or else TSA_URL_ENV, refused now naming the variable rather than after a build. `writes`: bundles
    are about to be written, and TSA_CERTS_ENV set with no authority to ask is refused too: each bundle would carry
    no timestamp, which every reader with TSA_CERTS_ENV set refuses (and a push would add another each time)."""
    url = option if option is not None else configured_url()
    if writes and not url and _setting(TSA_CERTS_ENV, "a PEM file of the timestamp authority's certificates"):
        raise UserError(f"{TSA_CERTS_ENV} names a timestamp authority to trust, and neither {TSA_URL_ENV} nor --tsa "
                        "names one to ask: every Sigstore bundle written would carry no RFC 3161 timestamp, which "
                        f"release and verify refuse with {TSA_CERTS_ENV} set; set {TSA_URL_ENV} to that authority's "
                        f"URL, or unset {TSA_CERTS_ENV}")


@contextmanager
def using(url: str | None) -> Iterator[None]:
    """TSA_URL_ENV set to `url` (a `--tsa` option, checked by the command) while the block runs; None: as it is."""
    if url is None:
        yield
        return
    before = os.environ.get(TSA_URL_ENV)
    os.environ[TSA_URL_ENV] = url
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TSA_URL_ENV, None)
        else:
            os.environ[TSA_URL_ENV] = before


def request_timestamp(url: str, data: bytes) -> bytes:
    """The DER TimeStampResp of the authority at `url` over sha256(`data`), checked to be granted, to answer our
    nonce and to stamp our digest; FailedError naming the authority otherwise."""
    import requests
    from rfc3161_client import HashAlgorithm, PKIStatus, TimestampRequestBuilder, decode_timestamp_response

    from buildtool.common.urls import no_netrc, shown_url

    named = shown_url(url)   # a token in the URL's query never reaches a message

    request = (TimestampRequestBuilder().data(data).hash_algorithm(HashAlgorithm.SHA256)
               .nonce(nonce=True).cert_request(cert_request=True).build())
    try:
        # An auth that adds nothing, and no redirect followed: requests otherwise sends ~/.netrc's login for the
        # authority's host (its `default` entry for any host), and again to wherever a redirect points.
        answer = requests.post(url, data=request.as_bytes(), headers={"Content-Type": QUERY_TYPE}, timeout=TIMEOUT_S,
                               auth=no_netrc, allow_redirects=False)
    except requests.RequestException as exc:
        raise FailedError(f"the timestamp authority {named} cannot be reached ({type(exc).__name__})") from None
    if answer.is_redirect:
        raise FailedError(f"the timestamp authority {named} answered HTTP {answer.status_code}, a redirect, which is "
                          f"not followed: set {TSA_URL_ENV} to the URL it redirects to")
    if answer.status_code != 200:
        raise FailedError(f"the timestamp authority {named} answered HTTP {answer.status_code}")
    try:
        stamp = decode_timestamp_response(answer.content)
    except ValueError as exc:
        raise FailedError(f"the timestamp authority {named} answered no RFC 3161 TimeStampResp ({exc})") from None
    # As a number: PKIStatus(n) of a status RFC 3161 does not define (6 or more) was a ValueError traceback.
    if stamp.status not in (PKIStatus.GRANTED.value, PKIStatus.GRANTED_WITH_MODS.value):
        raise FailedError(f"the timestamp authority {named} refused the request (status {stamp.status})")
    if stamp.tst_info.nonce != request.nonce:
        raise FailedError(f"the timestamp authority {named} answered another request (nonce mismatch)")
    if stamp.tst_info.message_imprint.message != hashlib.sha256(data).digest():
        raise FailedError(f"the timestamp authority {named} stamped another digest than the signature's")
    return answer.content


@dataclass(frozen=True)
class Authority:
    """A timestamp authority a reader trusts: its signing certificate and the chain up to a root (DER)."""

    source: str
    leaf: bytes
    intermediates: tuple[bytes, ...]
    root: bytes


def load_authority(path: Path) -> Authority:
    """The authority of a PEM file (signing certificate first, root last); UserError naming the file."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    try:
        certs = x509.load_pem_x509_certificates(path.read_bytes())
    except OSError as exc:
        raise UserError(f"{TSA_CERTS_ENV}: {path} cannot be read ({exc.strerror})") from None
    except ValueError as exc:
        raise UserError(f"{TSA_CERTS_ENV}: {path} holds no PEM certificates ({exc})") from None
    if len(certs) < 2:
        raise UserError(f"{TSA_CERTS_ENV}: {path} must hold the authority's signing certificate and its root "
                        f"(found {len(certs)} certificate)")
    der = [c.public_bytes(Encoding.DER) for c in certs]
    return Authority(str(path), der[0], tuple(der[1:-1]), der[-1])


def configured_authority() -> Authority | None:
    """The authority TSA_CERTS_ENV names, None when unset or empty."""
    named = _setting(TSA_CERTS_ENV, "a PEM file of the timestamp authority's certificates")
    return load_authority(Path(named)) if named else None


def timestamp_problem(stamp: bytes, data: bytes, authority: Authority) -> str:
    """Why the DER TimeStampResp `stamp` is no timestamp by `authority` over `data` ("" when it is one)."""
    from cryptography import x509
    from rfc3161_client import VerificationError, VerifierBuilder, decode_timestamp_response

    try:
        decoded = decode_timestamp_response(stamp)
    except ValueError as exc:
        return f"not an RFC 3161 TimeStampResp ({exc})"
    builder = (VerifierBuilder().tsa_certificate(x509.load_der_x509_certificate(authority.leaf))
               .add_root_certificate(x509.load_der_x509_certificate(authority.root)))
    for der in authority.intermediates:
        builder = builder.add_intermediate_certificate(x509.load_der_x509_certificate(der))
    try:
        builder.build().verify_message(decoded, data)
    except (VerificationError, ValueError) as exc:
        return f"does not verify with the timestamp authority of {authority.source} ({str(exc)[:200]})"
    return ""
