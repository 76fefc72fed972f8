#!/usr/bin/env bash
# Runs every check llmfleet has, from lint to the whole-stack lab, and ends
# with a one-screen summary. Exits non-zero when any stage fails.
#   scripts/test.sh            all stages
#   scripts/test.sh unit lab   only the named stages
# Each stage's full output is kept in out/test-logs/<stage>.log, every line
# stamped with the time it was written, so a slow step shows in the log; a
# failing stage also prints its last lines here.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh || { echo "bootstrap failed: nothing was tested" >&2; exit 1; }
export PATH="$PWD/.venv/bin:$PATH"
export ANSIBLE_NOCOLOR=1 PY_COLORS=0

log_dir=out/test-logs
mkdir -p "$log_dir"

lint_yaml() { yamllint --strict .; }
lint_ansible() { ansible-lint; }
lint_python() { ruff check . && mypy; }
syntax_check() {
  local playbook inventory
  for inventory in inventories/lab inventories/production.example; do
    for playbook in playbooks/*.yml; do
      ansible-playbook -i "$inventory" --syntax-check "$playbook" || return 1
    done
    # The inventory check itself runs on the controller only: prove both
    # shipped inventories pass it.
    ansible-playbook -i "$inventory" playbooks/inventory_check.yml || return 1
  done
}
unit() { pytest -q tests/unit; }
molecule_roles() {
  local scenario role
  # The scenarios run on the local Docker engine from the lab's base image:
  # start the engine and build the images first (no-ops when ready).
  llmfleet lab image || return 1
  # The gateway scenario runs the gateway and workers from the service image.
  llmfleet image build service || return 1
  for scenario in roles/*/molecule/*/molecule.yml; do
    role=${scenario#roles/}; role=${role%%/*}
    echo "=== molecule: role $role, scenario $(basename "$(dirname "$scenario")")"
    (cd "roles/$role" && molecule test -s "$(basename "$(dirname "$scenario")")") || return 1
  done
}
# --durations: the slowest tests are named at the end of each log.
integration() { pytest -q --durations=15 tests/integration; }
lab() { pytest -q --durations=15 tests/lab; }

stamp_lines() { while IFS= read -r line; do printf '%(%H:%M:%S)T %s\n' -1 "$line"; done; }

all_stages=(lint_yaml lint_ansible lint_python syntax_check unit molecule_roles integration lab)
stages=("${@:-${all_stages[@]}}")

declare -a summary
failed=0
passed=0
for stage in "${stages[@]}"; do
  if ! declare -F "$stage" >/dev/null; then
    echo "unknown stage '$stage'; stages: ${all_stages[*]}" >&2
    exit 2
  fi
  echo "--- $stage"
  started=$(date +%s)
  if "$stage" 2>&1 | stamp_lines >"$log_dir/$stage.log"; then
    status=PASS; passed=$((passed + 1))
  else
    status=FAIL; failed=$((failed + 1))
    tail -n 60 "$log_dir/$stage.log"
  fi
  summary+=("$(printf '%-16s %s %5ss' "$stage" "$status" "$(($(date +%s) - started))")")
done

echo
echo "=== llmfleet test summary (logs: $log_dir/)"
printf '%s\n' "${summary[@]}"
echo "stages: $passed passed, $failed failed"
((failed == 0))
