#!/usr/bin/env node
// Verify Sigstore bundles (v0.3, DSSE content, public-key verification material) with sigstore-js's
// @sigstore/verify: a verifier the toolkit did not write, pinned by package-lock.json, run offline.
//
//   tools/sigstore-verify/node_modules/.bin/node tools/sigstore-verify/verify.js --keys config/trusted-keys.yaml
//        [--role builder|tester] [--digest sha256:HEX] [--tsa-certs TSA.pem] BUNDLE.json...
//
// @sigstore/verify 4.x runs on Node >= 22.22.2; `npm ci` installs that Node beside it (the node-linux-* package
// of package-lock.json) as node_modules/.bin/node, and an older Node is refused here (exit 2).
//
// Trust: the Ed25519 public keys of the trusted keys file (`keys[].public_key`, PEM; `--role` keeps only the
// keys trusted in that role). A bundle names its key by `verificationMaterial.publicKey.hint`; the key finder
// answers a hint with the key whose id is that hint (the toolkit's key id: sha256 of the raw 32-byte public
// key, hex, computed here from the PEM) and refuses any other hint.
// No transparency log, no Fulcio certificate: these keys are long-lived project keys, not Sigstore's
// public-good instance, so the trusted root has no log and no CA, and tlogThreshold and ctlogThreshold are 0
// (a bundle that carries tlog entries is still checked against them and refused, having no log to check them
// with). Timestamps: without --tsa-certs the trusted root has no timestamp authority and timestampThreshold is
// 0 (the Verifier then checks the key and the DSSE signature over PAE; a bundle carrying a timestamp is refused,
// there being no authority to verify it with). With --tsa-certs FILE (PEM: the authority's signing
// certificate, then its chain up to the root) the trusted root holds that authority and the threshold is the
// Verifier's default, 1: each bundle must carry a timestamp by it over its signature, as the top-level
// `sigstore.verify()` demands (it passes only tlogThreshold and ctlogThreshold). The top-level function
// itself is not used: it fetches the trusted root by TUF from the network first.
// With --digest, the signed in-toto Statement must name that digest as a subject (what ties the attestation
// to the image; the OCI manifest's `subject` is not signed).
//
// Prints one JSON line per bundle ({"bundle", "verified", "keyid", "predicateType"} or {"bundle",
// "verified": false, "code", "reason"}); exit 0 when every bundle verified, 1 when one did not, 2 for bad use.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const { bundleFromJSON } = require('@sigstore/bundle');
const { TrustedRoot } = require('@sigstore/protobuf-specs');
const MIN_NODE = [22, 22, 2];
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');
const YAML = require('yaml');

function usage(message) {
  process.stderr.write(`verify.js: ${message}\n`);
  process.exit(2);
}

function checkNode() {
  const have = process.versions.node.split('.').map(Number);
  const first = MIN_NODE.findIndex((n, i) => have[i] !== n);   // the first part that differs, -1: equal
  if (first >= 0 && have[first] < MIN_NODE[first]) {
    usage(`Node ${process.versions.node} is older than @sigstore/verify 4.x needs (${MIN_NODE.join('.')}): run `
      + 'tools/sigstore-verify/node_modules/.bin/node, which `npm ci` installs (bash scripts/setup.sh)');
  }
}

function parseArgs(argv) {
  const args = { keys: null, role: null, digest: null, tsaCerts: null, bundles: [] };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--keys' || arg === '--role' || arg === '--digest' || arg === '--tsa-certs') {
      if (i + 1 >= argv.length) usage(`${arg} needs a value`);
      args[arg === '--tsa-certs' ? 'tsaCerts' : arg.slice(2)] = argv[++i];
    } else if (arg.startsWith('--')) {
      usage(`unknown option ${arg}`);
    } else {
      args.bundles.push(arg);
    }
  }
  if (!args.keys) usage('--keys FILE is required (the trusted keys file)');
  if (args.role && !['builder', 'tester'].includes(args.role)) usage(`--role ${args.role}: builder or tester`);
  if (args.digest && !/^sha256:[0-9a-f]{64}$/.test(args.digest)) usage(`--digest ${args.digest}: sha256:<64 hex>`);
  if (!args.bundles.length) usage('no bundle given');
  return args;
}

// hint (key id) -> KeyObject, from the trusted keys file; fails closed on anything it cannot read.
function trustedKeys(file, role) {
  let doc;
  try {
    doc = YAML.parse(fs.readFileSync(file, 'utf8'));
  } catch (err) {
    usage(`${file}: ${err.message}`);
  }
  if (!doc || !Array.isArray(doc.keys)) usage(`${file}: no keys list`);
  const keys = new Map();
  doc.keys.forEach((entry, i) => {
    if (!entry || typeof entry.public_key !== 'string') usage(`${file}: keys[${i}] has no public_key`);
    if (role && !(Array.isArray(entry.roles) && entry.roles.includes(role))) return;
    let key;
    try {
      key = crypto.createPublicKey(entry.public_key);
    } catch (err) {
      usage(`${file}: keys[${i}] (${entry.name}) is not a PEM public key: ${err.message}`);
    }
    if (key.asymmetricKeyType !== 'ed25519') usage(`${file}: keys[${i}] is ${key.asymmetricKeyType}, not Ed25519`);
    const raw = Buffer.from(key.export({ format: 'jwk' }).x, 'base64url');
    keys.set(crypto.createHash('sha256').update(raw).digest('hex'), key);
  });
  return keys;
}

// The trusted root: no log, no CA; the timestamp authority of --tsa-certs where given (its chain, leaf first).
function trustedRoot(tsaCerts) {
  if (!tsaCerts) return TrustedRoot.fromJSON({});
  let pem;
  try {
    pem = fs.readFileSync(tsaCerts, 'utf8');
  } catch (err) {
    usage(`--tsa-certs ${tsaCerts}: ${err.message}`);
  }
  const blocks = pem.match(/-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----/g) || [];
  if (blocks.length < 2) usage(`--tsa-certs ${tsaCerts}: want the authority's certificate and its root, found ${blocks.length}`);
  const certificates = blocks.map((block) => {
    try {
      return { rawBytes: new crypto.X509Certificate(block).raw.toString('base64') };
    } catch (err) {
      return usage(`--tsa-certs ${tsaCerts}: ${err.message}`);
    }
  });
  return TrustedRoot.fromJSON({
    mediaType: 'application/vnd.dev.sigstore.trustedroot+json;version=0.1',
    timestampAuthorities: [{ subject: { organization: 'trusted by --tsa-certs', commonName: tsaCerts },
      certChain: { certificates }, validFor: { start: '1970-01-01T00:00:00Z' } }],
  });
}

function verifyOne(path, verifier, digest) {
  const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(path, 'utf8')));
  const signer = verifier.verify(toSignedEntity(bundle));
  const statement = JSON.parse(Buffer.from(bundle.content.dsseEnvelope.payload).toString('utf8'));
  if (digest) {
    const hex = digest.slice('sha256:'.length);
    const named = (statement.subject || []).some((s) => s && s.digest && s.digest.sha256 === hex);
    if (!named) {
      const err = new Error(`the signed statement's subject does not name ${digest}`);
      err.code = 'SUBJECT_ERROR';
      throw err;
    }
  }
  return { keyid: bundle.verificationMaterial.content.publicKey.hint, predicateType: statement.predicateType,
    signerKey: signer.key.asymmetricKeyType };
}

function main() {
  checkNode();
  const args = parseArgs(process.argv.slice(2));
  const keys = trustedKeys(args.keys, args.role);
  const finder = (hint) => {
    const key = keys.get(hint);
    if (!key) {
      const err = new Error(`key not found: ${hint} is not a trusted key${args.role ? ` in role ${args.role}` : ''}`);
      err.code = 'PUBLIC_KEY_ERROR';
      throw err;
    }
    return { publicKey: key, validFor: () => true };   // project keys carry no validity window
  };
  // With a timestamp authority: the thresholds `sigstore.verify({tlogThreshold: 0})` gives the Verifier.
  const thresholds = args.tsaCerts ? { tlogThreshold: 0, ctlogThreshold: 0 }
    : { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 };
  const verifier = new Verifier(toTrustMaterial(trustedRoot(args.tsaCerts), finder), thresholds);
  let failed = 0;
  for (const path of args.bundles) {
    try {
      const found = verifyOne(path, verifier, args.digest);
      process.stdout.write(JSON.stringify({ bundle: path, verified: true, keyid: found.keyid,
        predicateType: found.predicateType }) + '\n');
    } catch (err) {
      failed++;
      process.stdout.write(JSON.stringify({ bundle: path, verified: false, code: err.code || err.name,
        reason: err.message }) + '\n');
    }
  }
  process.exit(failed ? 1 : 0);
}

main();
