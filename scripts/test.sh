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
# Two processes, one per core: the slow unit tests each run an ansible-playbook or promtool.
unit() { pytest -q --numprocesses 2 tests/unit; }
# Scenarios run two at a time by default: much of each one is spent waiting on
# containers and systemd, so two share a 2-core machine nearly for free.
molecule_jobs=${LLMFLEET_MOLECULE_JOBS:-2}
if [[ ! $molecule_jobs =~ ^[1-9][0-9]*$ ]]; then
  # 0 or a word would leave molecule_roles waiting for a scenario that never started.
  echo "LLMFLEET_MOLECULE_JOBS must be a whole number from 1 (one scenario at a time), not '$molecule_jobs'" >&2
  exit 2
fi
molecule_roles() {
  local scenario role name failed=0 dir="$log_dir/molecule"
  local -A log_of=()  # the running scenarios: their pid -> their log
  # The scenarios run on the local Docker engine from the lab's base image:
  # start the engine and build the images first (no-ops when ready).
  llmfleet lab image || return 1
  # The gateway scenario runs the gateway and workers from the service image.
  llmfleet image build service || return 1
  mkdir -p "$dir"
  for scenario in $(molecule_scenarios); do
    role=${scenario#roles/}; role=${role%%/*}
    name=$(basename "$(dirname "$scenario")")
    while ((${#log_of[@]} >= molecule_jobs)); do
      molecule_reap || failed=1
    done
    echo "=== molecule: role $role, scenario $name (log: $dir/$role-$name.log)"
    (cd "roles/$role" && molecule test -s "$name") 2>&1 | stamp_lines >"$dir/$role-$name.log" &
    log_of[$!]="$dir/$role-$name.log"
  done
  while ((${#log_of[@]} > 0)); do
    molecule_reap || failed=1
  done
  return "$failed"
}
# Every role's scenarios, the longest first: started last, the scaler's 4 minutes
# ran alone while the other slot sat idle (measured, out/test-logs/molecule/).
molecule_longest=(scaler gateway python_toolchain nvidia_driver)
molecule_scenarios() {
  local scenario role
  for role in "${molecule_longest[@]}"; do
    for scenario in roles/"$role"/molecule/*/molecule.yml; do
      if [[ -e $scenario ]]; then echo "$scenario"; fi
    done
  done
  for scenario in roles/*/molecule/*/molecule.yml; do
    role=${scenario#roles/}; role=${role%%/*}
    if [[ " ${molecule_longest[*]} " != *" $role "* ]]; then echo "$scenario"; fi
  done
}
# Waits for one of molecule_roles' running scenarios (its log_of) to end and
# reports it; a failure also prints its log's tail.
molecule_reap() {
  local finished status
  wait -n -p finished "${!log_of[@]}"
  status=$?
  if ((status == 0)); then
    echo "=== molecule: PASS ${log_of[$finished]}"
  else
    echo "=== molecule: FAIL ${log_of[$finished]}"
    tail -n 80 "${log_of[$finished]}"
  fi
  unset "log_of[$finished]"
  return "$status"
}
# --durations: the slowest tests are named at the end of each log.
integration() { pytest -q --durations=15 tests/integration; }
# -rfEP: failures and errors named in the short summary at the end (the tail CI prints),
# and the passing tests' output, such as the scaling test's timings (also in
# out/test-logs/lab-scaler/timings.txt).
lab() { pytest -q -rfEP --durations=15 tests/lab; }

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
