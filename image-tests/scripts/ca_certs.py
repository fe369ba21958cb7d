"""The CA certificates Python's default SSL context trusts: what urllib verifies an HTTPS server
against (torch.hub's and Keras' downloads; pip and requests carry certifi's own). Run with the
image's Python and its site, as a user's script. Writes result.json: how many certificates the
context loaded from the CA file, how many hashed ones the CA folders offer, and where those are."""

import os
import re
import ssl

from probe_io import result

paths = ssl.get_default_verify_paths()   # where OpenSSL looks: $SSL_CERT_FILE, $SSL_CERT_DIR, else built in
cafile = os.environ.get(paths.openssl_cafile_env) or paths.openssl_cafile
capath = os.environ.get(paths.openssl_capath_env) or paths.openssl_capath
hashed = [name for folder in capath.split(os.pathsep) if os.path.isdir(folder) for name in os.listdir(folder)
          if re.fullmatch(r"[0-9a-f]{8}\.\d+", name) and os.path.isfile(os.path.join(folder, name))]
result({"loaded": ssl.create_default_context().cert_store_stats()["x509_ca"], "hashed": len(hashed),
        "cafile": cafile, "capath": capath})
