#!/usr/bin/env node
// Verify Sigstore bundles (v0.3, DSSE content, public-key verification material) with sigstore-js's
// @sigstore/verify: a verifier the toolkit did not write, pinned by package-lock.json, run offline.
//
//   node tools/sigstore-verify/verify.js --keys config/trusted-keys.yaml [--role builder|tester]
//        [--digest sha256:HEX] BUNDLE.json...
//
// Trust: the Ed25519 public keys of the trusted keys file (`keys[].public_key`, PEM; `--role` keeps only the
// keys trusted in that role). A bundle names its key by `verificationMaterial.publicKey.hint`; the key finder
// answers a hint with the key whose id is that hint (the toolkit's key id: sha256 of the raw 32-byte public
// key, hex, computed here from the PEM) and refuses any other hint.
// No transparency log, no Fulcio certificate, no timestamp authority: these keys are long-lived project keys,
// not Sigstore's public-good instance, so the trusted root is empty and the Verifier's tlogThreshold,
// ctlogThreshold and tsaThreshold are all 0 (it then checks the key and the DSSE signature over PAE and
// nothing else; a bundle that carries tlog entries is still checked against them and refused, having no log
// to check them with). The top-level `sigstore.verify` is not used: it fetches TUF metadata first.
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
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');
const YAML = require('yaml');

function usage(message) {
  process.stderr.write(`verify.js: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const args = { keys: null, role: null, digest: null, bundles: [] };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--keys' || arg === '--role' || arg === '--digest') {
      if (i + 1 >= argv.length) usage(`${arg} needs a value`);
      args[arg.slice(2)] = argv[++i];
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
  const verifier = new Verifier(toTrustMaterial(TrustedRoot.fromJSON({}), finder),
    { tlogThreshold: 0, ctlogThreshold: 0, tsaThreshold: 0 });
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
