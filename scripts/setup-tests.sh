#!/usr/bin/env bash
# Set up what only the toolkit's own tests need, on top of the main job's set-up; idempotent. The README's test
# command (and .ci/run, which runs it) is `bash scripts/setup-tests.sh && make check lint test`:
#   0. scripts/setup.sh: the main job's packages, engine, registry and .venv (it says what it found done)
#   1. apt packages (as root or with sudo, only those missing): qemu-user-static and binfmt-support (linux/arm64 under
#      emulation: the multi-platform builds and tests), chromium (the report's rendering test), nodejs and npm
#      (the Sigstore verifier), and for the SLURM tests slurm-wlm, munge, runc and umoci (SETUP_SKIP_SLURM=1
#      leaves these out; the tests start their own private SLURM and stop it, nothing here starts a daemon)
#   2. QEMU for linux/arm64 (scripts/binfmt.sh): binfmt_misc mounted if it is not, the qemu-aarch64
#      entry enabled if it is not, then checked for flag F; a one-line error naming the fix otherwise
#   3. the Sigstore verifier CI runs on every published bundle: `npm ci` in tools/sigstore-verify (exact
#      versions from its package-lock.json, the Node 22 that @sigstore/verify 4.x needs among them, as
#      tools/sigstore-verify/node_modules/.bin/node; redone only when the lock changed)
#   4. .venv: the test extras (`-e '.[dev,scaling]'`: linters, the test tools, torch 2.13.0 for the host's scaling
#      tests, which uv takes from a local CPU wheel where the host's pip settings name one), installed by the uv
#      setup.sh put there, with requirements.lock as constraints
# Rerunning changes nothing; every step says whether it did something or found it done.
# Settings: SETUP_SKIP_SLURM=1 leaves out the SLURM packages; SETUP_SKIP_VENV=1 skips step 4 (and setup.sh's).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STATE="$ROOT/.state"
started=$SECONDS

say() { printf 'setup-tests: %s\n' "$*" >&2; }
die() { printf 'setup-tests: error: %s\n' "$*" >&2; exit 2; }
# shellcheck source=scripts/as-root.sh
source "$(dirname "${BASH_SOURCE[0]}")/as-root.sh"   # can_root, as_root

# -- 0. the main job's set-up -----------------------------------------------------------------
bash "$ROOT/scripts/setup.sh"

# -- 1. packages ----------------------------------------------------------------------------
need=()
# QEMU user emulation for linux/arm64 images (debootstrap --arch=arm64, builds and containers), registered
# with binfmt_misc by binfmt-support's update-binfmts (step 2).
[[ -x /usr/bin/qemu-aarch64-static ]] || need+=(qemu-user-static)
command -v update-binfmts >/dev/null 2>&1 || need+=(binfmt-support)
# Headless Chromium renders the nightly report in its test.
command -v /usr/bin/chromium >/dev/null 2>&1 || need+=(chromium)
# Node for tools/sigstore-verify (sigstore-js verifies the published Sigstore bundles in CI; step 3).
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# A real SLURM for tests/integration/test_slurm_cluster.py: two nodes on this machine, SLURM's own OCI
# containers through runc, bundles unpacked with umoci (about 13 s to install).
if [[ "${SETUP_SKIP_SLURM:-0}" != 1 ]]; then
  [[ -x /usr/sbin/slurmctld && -x /usr/sbin/slurmd ]] || need+=(slurm-wlm)
  [[ -x /usr/sbin/munged ]] || need+=(munge)
  command -v runc >/dev/null 2>&1 || need+=(runc)
  command -v umoci >/dev/null 2>&1 || need+=(umoci)
fi
if ((${#need[@]})); then
  can_root || die "missing ${need[*]}; run this script as root or with passwordless sudo (it installs them with apt)"
  say "installing ${need[*]} (apt-get)"
  as_root timeout 600 apt-get update -qq || die "apt-get update failed (exit $?; 124: timed out after 600 s)"
  as_root env DEBIAN_FRONTEND=noninteractive timeout 1200 apt-get install -y -qq --no-install-recommends "${need[@]}" \
    >"$STATE/apt-tests.log" 2>&1 \
    || { tail -20 "$STATE/apt-tests.log" >&2; die "apt-get install failed (log: .state/apt-tests.log)"; }
  # The SLURM packages' own daemons, when this run installed them: the tests start private ones.
  if [[ " ${need[*]} " == *" slurm-wlm "* || " ${need[*]} " == *" munge "* ]]; then
    for unit in slurmctld slurmd munge; do
      if systemctl is-active --quiet "$unit" 2>/dev/null; then as_root systemctl disable --now "$unit" || true; fi
    done
  fi
else
  say "packages present: qemu-user-static binfmt-support chromium node npm$([[ "${SETUP_SKIP_SLURM:-0}" == 1 ]] \
    || echo ' slurm-wlm munge runc umoci')"
fi

# -- 2. QEMU for linux/arm64 ----------------------------------------------------------------
bash "$ROOT/scripts/binfmt.sh"

# -- 3. the Sigstore verifier (tools/sigstore-verify) -----------------------------------------
VERIFIER="$ROOT/tools/sigstore-verify"
vstamp="$(sha256sum "$VERIFIER/package-lock.json" | cut -c1-16)"
if [[ -f "$VERIFIER/node_modules/.setup-stamp" && "$(cat "$VERIFIER/node_modules/.setup-stamp")" == "$vstamp" ]]; then
  say "sigstore verifier up to date (tools/sigstore-verify)"
else
  say "installing the sigstore verifier (npm ci in tools/sigstore-verify, log: .state/npm.log)"
  (cd "$VERIFIER" && timeout 600 npm ci --no-audit --no-fund --ignore-scripts) >"$STATE/npm.log" 2>&1 \
    || { tail -20 "$STATE/npm.log" >&2; die "npm ci in tools/sigstore-verify failed (log: .state/npm.log)"; }
  echo "$vstamp" >"$VERIFIER/node_modules/.setup-stamp"
  say "sigstore verifier ready"
fi

# -- 4. the test extras in .venv ------------------------------------------------------------
if [[ "${SETUP_SKIP_VENV:-0}" == 1 ]]; then
  say "skipping .venv (SETUP_SKIP_VENV=1)"
  exit 0
fi
VENV="$ROOT/.venv"
stamp="$(cat "$ROOT/pyproject.toml" "$ROOT/requirements.lock" | sha256sum | cut -c1-16)"
if [[ -f "$VENV/.setup-tests-stamp" && "$(cat "$VENV/.setup-tests-stamp")" == "$stamp" ]] \
   && "$VENV/bin/python" -c 'import buildtool.cli, pytest, torch' >/dev/null 2>&1; then
  say ".venv's test extras up to date"
else
  say "installing the test extras into .venv (uv pip install -c requirements.lock -e '.[dev,scaling]', log: .state/uv-tests.log)"
  # --compile-bytecode, as pip does: without the caches every command compiles what it imports again.
  (cd "$ROOT" && UV_CONFIG_FILE="$STATE/uv.toml" timeout 1200 "$VENV/bin/uv" pip install --compile-bytecode \
    --python "$VENV/bin/python" -c requirements.lock -e '.[dev,scaling]') >"$STATE/uv-tests.log" 2>&1 \
    || { tail -20 "$STATE/uv-tests.log" >&2; die "uv pip install into .venv failed (log: .state/uv-tests.log)"; }
  echo "$stamp" >"$VENV/.setup-tests-stamp"
  say ".venv's test extras ready"
fi
say "done in $((SECONDS - started)) s"
