#!/usr/bin/env bash
# Installs what llmfleet's own tooling needs on a Debian/Ubuntu machine, as root:
# distro packages when missing, then the pinned Python toolchain in .venv.
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the controller needs, each only when absent. A Python with
# a working venv module (pyenv, a custom build) is used as it is; docker.io
# only when no engine exists, so a machine with Docker CE keeps it.
# prometheus: promtool, which the alert rule tests run (tests/unit/roles/test_alert_rules.py).
# prometheus-alertmanager: the Alertmanager the maintenance silences are tested against
# (tests/integration/ops/test_maintenance_silence.py), and amtool.
packages=(git debootstrap redis-server equivs dpkg-dev prometheus prometheus-alertmanager openssh-client)
command -v python3 >/dev/null || packages+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || packages+=(python3-venv)
command -v dockerd >/dev/null || packages+=(docker.io)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The venv is rebuilt when the pins change: its stamp is a hash of them.
stamp=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [[ "$(cat .venv/.llmfleet-stamp 2>/dev/null)" != "$stamp" ]]; then
  echo "bootstrap: creating .venv from constraints.txt"
  rm -rf .venv
  python3 -m venv .venv
  # -qq: the machine-wide pip configuration may name index folders that do not
  # exist; pip warns once per package about them, which buries real errors.
  .venv/bin/pip install -qq --constraint constraints.txt --editable '.[ops,dev]'
  echo "$stamp" > .venv/.llmfleet-stamp
fi
