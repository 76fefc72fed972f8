#!/usr/bin/env bash
# Brings up the lab and runs the whole site against it:
#   1. installs the toolchain (scripts/bootstrap.sh),
#   2. `llmfleet lab up`: Docker engine, base image, systemd hosts,
#   3. `ansible-playbook playbooks/site.yml` against inventories/lab,
#   4. prints what runs now and how to reach it.
# Extra arguments go to ansible-playbook (e.g. --tags common, -v).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

llmfleet lab up
ansible-playbook -i inventories/lab playbooks/site.yml "$@"

echo
echo "The lab is up. What runs now:"
llmfleet lab status
cat <<'TXT'

Reach a host:     docker exec -it llmfleet-lab-gw1 bash
Run one layer:    .venv/bin/ansible-playbook -i inventories/lab playbooks/common.yml
Tear it down:     .venv/bin/llmfleet lab down
TXT
