// sigstore-js's top-level verify(), as a user calls it for a keyed bundle (issue 52):
//   node tests/sigstore_top_level.js MIRROR_URL ROOT_JSON CACHE_DIR KEY_PEM BUNDLE.json
// The trusted root comes by TUF from MIRROR_URL (tests/tuf_repo.py), anchored at ROOT_JSON; the key selector
// answers every hint with KEY_PEM; tlogThreshold 0 (a keyed bundle has no log entry). Prints one JSON line:
// {"verified": true} or {"verified": false, "code", "reason"}; exit 0 or 1. Run with the Node and the modules of
// tools/sigstore-verify (NODE_PATH=tools/sigstore-verify/node_modules).
'use strict';

const fs = require('fs');
const sigstore = require('sigstore');

async function main() {
  const [mirror, root, cache, keyFile, bundleFile] = process.argv.slice(2);
  const pem = fs.readFileSync(keyFile, 'utf8');
  const bundle = JSON.parse(fs.readFileSync(bundleFile, 'utf8'));
  try {
    await sigstore.verify(bundle, {
      keySelector: () => pem, tlogThreshold: 0, ctLogThreshold: 0,
      tufMirrorURL: mirror, tufRootPath: root, tufCachePath: cache, timeout: 5000, retry: { retries: 0 },
    });
    process.stdout.write(JSON.stringify({ verified: true }) + '\n');
  } catch (err) {
    process.stdout.write(JSON.stringify({ verified: false, code: err.code || err.name, reason: err.message }) + '\n');
    process.exit(1);
  }
}

main();
