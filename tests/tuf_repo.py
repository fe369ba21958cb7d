"""A TUF repository on loopback that serves a Sigstore trusted root (issue 52), so sigstore-js's top-level
`sigstore.verify()`, which fetches `trusted_root.json` by TUF before it verifies anything, runs offline here.

Written with python-tuf's Metadata API (root, targets, snapshot, timestamp; one Ed25519 key signs every role;
no consistent snapshots: `timestamp.json`, `snapshot.json`, `targets.json`, `targets/trusted_root.json`), as
Sigstore's own TUF repository is laid out; the client is given `root.json` as its trust anchor (`tufRootPath`).
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, TargetFile, Targets, Timestamp
from tuf.api.serialization.json import JSONSerializer

TRUSTED_ROOT = "trusted_root.json"


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


class TufRepository:
    """`with TufRepository(folder, trusted_root) as repo:` serves on repo.url; repo.root is the root.json."""

    def __init__(self, folder: Path, trusted_root: dict[str, Any]) -> None:
        self.folder = folder
        (folder / "targets").mkdir(parents=True)
        data = json.dumps(trusted_root).encode()
        (folder / "targets" / TRUSTED_ROOT).write_bytes(data)
        signer = CryptoSigner.generate_ed25519()
        expires = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
        root = Metadata(Root(expires=expires, consistent_snapshot=False))
        for role in ("root", "targets", "snapshot", "timestamp"):
            root.signed.add_key(signer.public_key, role)
        targets = Metadata(Targets(expires=expires))
        targets.signed.targets[TRUSTED_ROOT] = TargetFile.from_data(TRUSTED_ROOT, data)
        snapshot = Metadata(Snapshot(expires=expires))
        snapshot.signed.meta["targets.json"] = MetaFile(version=targets.signed.version)
        timestamp = Metadata(Timestamp(expires=expires))
        timestamp.signed.snapshot_meta = MetaFile(version=snapshot.signed.version)
        serializer = JSONSerializer(compact=False)
        for name, metadata in (("root", root), ("targets", targets), ("snapshot", snapshot),
                               ("timestamp", timestamp)):
            metadata.sign(signer)
            metadata.to_file(str(folder / f"{name}.json"), serializer)
        (folder / "1.root.json").write_bytes((folder / "root.json").read_bytes())
        self.root = folder / "root.json"
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(folder)))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> TufRepository:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
