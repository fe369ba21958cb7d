"""A small RFC 3161 timestamp authority on loopback, for the tests of `--tsa` (issue 52).

It answers `application/timestamp-query` POSTs with a TimeStampResp (RFC 3161 section 2.4.2): status granted,
and a TimeStampToken, a CMS SignedData (RFC 5652) whose encapsulated content is the DER TSTInfo (the request's
messageImprint and nonce, a serial number, genTime), signed with ECDSA P-256 (sigstore-js verifies only ECDSA
timestamp signatures) over signed attributes contentType, messageDigest and ESS signingCertificateV2 (RFC 5816);
its signing certificate carries the critical extended key usage id-kp-timeStamping (RFC 3161 section 2.3) and
is issued by a root of its own. The certificate is in the token when the request asks (certReq).
Written with asn1crypto (the ASN.1) and cryptography (keys, certificates, signatures): what a real TSA such as
Sigstore's timestamp-authority answers, so rfc3161-client and sigstore-js verify it as they verify those.
"""

from __future__ import annotations

import hashlib
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from asn1crypto import cms, tsp
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

POLICY = "1.3.6.1.4.1.57264.2"   # an arbitrary policy OID (the one Sigstore's TSA answers with)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "dl-images tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey,
                 ca: bool) -> x509.Certificate:
    now = datetime.now(UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - timedelta(days=1)).not_valid_after(now + timedelta(days=30))
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                              critical=False))
    if ca:
        builder = (builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                                  critical=True))
    else:
        builder = (builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.TIME_STAMPING]), critical=True))
    return builder.sign(issuer_key, hashes.SHA256())


class LoopbackTsa:
    """`with LoopbackTsa(folder) as tsa:` serves on tsa.url; tsa.certs is the PEM chain (signing certificate,
    then root) a reader is given; tsa.requests counts the requests answered."""

    def __init__(self, folder: Path, name: str = "loopback TSA") -> None:
        self.root_key = ec.generate_private_key(ec.SECP256R1())
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.root = _certificate(f"{name} root", self.root_key, f"{name} root", self.root_key, ca=True)
        self.leaf = _certificate(name, self.key, f"{name} root", self.root_key, ca=False)
        self.certs = folder / f"{name.replace(' ', '-')}.pem"
        self.certs.write_bytes(self.leaf.public_bytes(Encoding.PEM) + self.root.public_bytes(Encoding.PEM))
        self.requests = 0
        self._serial = 0
        self._lock = threading.Lock()
        tsa = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Type") != "application/timestamp-query":
                    self.send_error(415)
                    return
                answer = tsa.answer(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/timestamp-reply")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/tsr"

    def __enter__(self) -> LoopbackTsa:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, query: bytes) -> bytes:
        """The DER TimeStampResp to a DER TimeStampReq."""
        request = tsp.TimeStampReq.load(query)
        with self._lock:
            self.requests += 1
            self._serial += 1
            serial = self._serial
        info = {"version": "v1", "policy": POLICY, "message_imprint": request["message_imprint"],
                "serial_number": serial, "gen_time": datetime.now(UTC).replace(microsecond=0),
                "accuracy": {"seconds": 1}}
        if request["nonce"].native is not None:
            info["nonce"] = request["nonce"]
        tst_info = tsp.TSTInfo(info)
        leaf = asn1_x509.Certificate.load(self.leaf.public_bytes(Encoding.DER))
        attributes = [
            cms.CMSAttribute({"type": "content_type", "values": ["tst_info"]}),
            cms.CMSAttribute({"type": "message_digest", "values": [hashlib.sha256(tst_info.dump()).digest()]}),
            cms.CMSAttribute({"type": "signing_certificate_v2", "values": [
                {"certs": [{"cert_hash": hashlib.sha256(leaf.dump()).digest()}]}]}),
        ]
        signed_attrs = cms.CMSAttributes(sorted(attributes, key=lambda a: a.dump()))   # DER: a SET OF is sorted
        signer = cms.SignerInfo({
            "version": "v1",
            "sid": cms.SignerIdentifier({"issuer_and_serial_number": {"issuer": leaf.issuer,
                                                                      "serial_number": leaf.serial_number}}),
            "digest_algorithm": {"algorithm": "sha256"}, "signed_attrs": signed_attrs,
            "signature_algorithm": {"algorithm": "sha256_ecdsa"}, "signature": b""})
        # The signature covers the signed attributes' DER with the SET tag in place of the [0] they carry.
        to_sign = b"\x31" + signer["signed_attrs"].dump()[1:]
        signer["signature"] = self.key.sign(to_sign, ec.ECDSA(hashes.SHA256()))
        signed = {"version": "v3", "digest_algorithms": [{"algorithm": "sha256"}],
                  "encap_content_info": {"content_type": "tst_info", "content": tst_info},
                  "signer_infos": [signer]}
        if request["cert_req"].native:
            signed["certificates"] = [leaf]
        token = cms.ContentInfo({"content_type": "signed_data", "content": cms.SignedData(signed)})
        return tsp.TimeStampResp({"status": {"status": "granted"}, "time_stamp_token": token}).dump()
