#!/usr/bin/env bash
# Brings up the lab and runs the whole site against it:
#   1. installs the toolchain (scripts/bootstrap.sh),
#   2. `llmfleet lab up`: Docker engine, base image, systemd hosts,
#   3. `ansible-playbook playbooks/site.yml` against inventories/lab,
#   4. prints what runs now and how to reach it, ending with a curl through
#      the gateway that works, with a freshly minted token.
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

# A client's view: a token signed with the gateway's key (read from the gateway
# host into a 0600 file that is removed on exit: never on a command line), and
# one completion through gateway, queue, worker and engine before the curl is
# shown, so what is printed is known to work.
gateway_host=llmfleet-lab-gw1
if ! address=$(docker exec "$gateway_host" docker port llmfleet-gateway-1 8080/tcp 2>/dev/null | head -n 1) \
    || [ -z "$address" ]; then
  echo "No gateway runs yet (a run limited by --tags?): run scripts/lab.sh again for a curl that works."
  exit 0
fi
secret_file=$(mktemp)
trap 'rm -f "$secret_file"' EXIT
docker exec "$gateway_host" cat /etc/llmfleet/gateway/jwt_secret >"$secret_file"
token=$(llmfleet token --sub lab-operator --models tiny --ttl 12h --secret-file "$secret_file")
body='{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":16}'
curl -fsS --max-time 60 "http://$address/v1/chat/completions" -H "Authorization: Bearer $token" \
  -H 'Content-Type: application/json' -d "$body" >/dev/null
cat <<TXT

Ask the gateway (the token is valid for 12 hours; mint another with
  llmfleet token --sub NAME --models tiny --secret-file FILE-WITH-THE-KEY):

curl http://$address/v1/chat/completions \\
  -H 'Authorization: Bearer $token' \\
  -H 'Content-Type: application/json' \\
  -d '$body'
TXT
