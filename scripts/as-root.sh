# shellcheck shell=bash
# Sourced by the set-up scripts. What needs root (apt-get, systemctl, dockerd, mount, update-binfmts) runs as root:
# directly when this is root, else through sudo where it asks no password (a GitHub-hosted runner's user, runner);
# the rest runs as the caller, so .state and .venv are theirs.
can_root() { [[ $(id -u) -eq 0 ]] || sudo -n true 2>/dev/null; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo -n "$@"; fi; }
