#!/usr/bin/env bash
# The compose smoke run: build the images here (build.sh), start docker-compose.yml on CPU (cpu_compose.py drops the
# GPU reservations), and check that Redis, the four services and the orchestrator come up healthy in the order the
# file declares, that a tiny-preset run completes in the containers with metrics and checkpoints on the volumes,
# that the reward HTTP API answers curl on its published port, that `restart reward` mid-run is survived, and that
# `down` then `up` resumes the run. With NODES=2 the policy runs as two torchrun nodes (the profile multi-node:
# policy-0 and policy-1, docs/multi-node.md), and mid-run every process of policy-1 is SIGKILLed (a node lost): the
# group must come back by compose's restart policy and the run finish with every step logged once. The last line
# printed is one JSON object:
#   {"built": true, "healthy": true, "steps": 60, "api": true, "restart_survived": true, "resumed": true, ...}
#
#   sudo bash deploy/smoke/compose.sh /path/to/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
#   sudo NODES=2 bash deploy/smoke/compose.sh /path/to/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
#
# Needs root (or the docker group), a running dockerd, docker-compose (1.29 or v2 as DOCKER_COMPOSE="docker
# compose"), debootstrap (for the base image, once), curl, and python3 with PyYAML. Takes minutes; not part of CI.
# Environment: STEPS (run length, default 60: long enough to restart and stop mid-run), CPUS (cap per Cooper
# container, default 1), PROJECT (compose project, default cooper-smoke), KEEP=1 (leave the containers and volumes
# for a look; else `down -v` at the end), TIMEOUT_S (each wait, default 900). Its containers talk only on the network
# compose creates; the one published port, the reward HTTP API, is a free port on 127.0.0.1.
set -euo pipefail
t0=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
wheel=${1:-${TORCH_WHEEL:-}}
steps=${STEPS:-60}
project=${PROJECT:-cooper-smoke}
timeout_s=${TIMEOUT_S:-900}
nodes=${NODES:-1}
[[ $nodes == 1 || $nodes == 2 ]] || { echo "compose.sh: NODES is 1 or 2, got $nodes" >&2; exit 2; }
profile=()
[[ $nodes == 2 ]] && profile=(--profile multi-node)
run=smoke
read -r -a compose_cmd <<<"${DOCKER_COMPOSE:-docker-compose}"
work=$(mktemp -d /tmp/cooper-smoke.XXXXXX)

built=false healthy=false logged=0 api=false restart_survived=false resumed=false build_s=null error=""
restart_at=null down_at=null node_kill_survived=null node_kill_at=null
finish() {
  local rc=$?
  [[ -n "${events_pid:-}" ]] && kill "$events_pid" 2>/dev/null
  if [[ "${KEEP:-0}" != 1 ]]; then dc down -v --remove-orphans >/dev/null 2>&1 || true; rm -rf "$work"; fi
  [[ $rc -ne 0 && -z "$error" ]] && error="exited $rc"
  printf '{"built": %s, "healthy": %s, "steps": %s, "api": %s, "restart_survived": %s, "resumed": %s, ' \
    "$built" "$healthy" "$logged" "$api" "$restart_survived" "$resumed"
  printf '"nodes": %s, "node_kill_survived": %s, "node_kill_at_step": %s, ' "$nodes" "$node_kill_survived" \
    "$node_kill_at"
  printf '"restart_at_step": %s, "down_at_step": %s, "build_seconds": %s, "seconds": %s, "error": %s}\n' \
    "$restart_at" "$down_at" "$build_s" "$(($(date +%s) - t0))" \
    "$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1] or None))' "$error")"
}
trap finish EXIT
say() { echo "compose.sh: $*" >&2; }
die() { error=$*; say "FAILED: $*"; exit 1; }
dc() { "${compose_cmd[@]}" -p "$project" --project-directory "$repo" -f "$work/docker-compose.yml" \
  --env-file "$work/smoke.env" "${profile[@]}" "$@"; }
# What the run wrote on the runs volume, read through a throwaway container without a network.
on_volume() { docker run --rm --network none -v "${project}_$1:/mnt:ro" --entrypoint "$2" cooper:0.1.0 "${@:3}"; }
metrics() { on_volume runs cat "/mnt/$run/metrics.jsonl" 2>/dev/null || true; }
steps_logged() { metrics | grep -c '"step"' || true; }
orchestrator() { docker inspect -f "$1" "$(dc ps -q orchestrator)"; }
health() { docker inspect -f '{{.State.Health.Status}}' "$(dc ps -q "$1")"; }
restarts() { docker inspect -f '{{.RestartCount}}' "$(dc ps -q "$1")"; }
wait_healthy() {
  local deadline=$(($(date +%s) + timeout_s))
  until [[ $(health "$1") == healthy ]]; do
    (($(date +%s) < deadline)) || { say "$1 was not healthy within ${timeout_s}s"; return 1; }
    sleep 2
  done
}
up() {
  if [[ $nodes == 2 ]]; then
    # The two policy nodes first, then the rest, with the one-container policy at zero (docs/multi-node.md): with
    # it at zero compose no longer holds the orchestrator until a policy is healthy.
    { dc up -d --scale policy=0 policy-0 policy-1 && wait_healthy policy-0 && dc up -d --scale policy=0; } \
      >"$work/up.log" 2>&1 || { tail -n 5 "$work/up.log" >&2; return 1; }
  else
    dc up -d >"$work/up.log" 2>&1 || { tail -n 5 "$work/up.log" >&2; return 1; }
  fi
}

# Wait until the run has logged at least $1 steps (or, with $2=exit, until the orchestrator has exited).
wait_for() {
  local deadline=$(($(date +%s) + timeout_s))
  while (($(date +%s) < deadline)); do
    logged=$(steps_logged)
    local state
    state=$(orchestrator '{{.State.Status}} {{.State.ExitCode}}' 2>/dev/null || echo "missing 0")
    if [[ "${2:-}" == exit && "$state" == exited* ]]; then return 0; fi
    if [[ "${2:-}" != exit && $logged -ge $1 ]]; then return 0; fi
    # A failed run exits non-zero, and compose's restart policy (on-failure) may already be starting it again.
    if [[ "$state" == "exited "[1-9]* || "$state" == restarting* ]]; then
      dc logs --tail 40 orchestrator >&2
      die "the orchestrator failed ($state)"
    fi
    sleep 2
  done
  dc logs --tail 40 >&2
  die "timed out after ${timeout_s}s waiting for ${1} steps (logged: $logged)"
}

score() {
  # Retried: right after a restart the port is published before the service inside listens.
  curl -sf --max-time 30 --retry 10 --retry-delay 2 --retry-connrefused "http://127.0.0.1:$port/v1/score" \
    -H 'Content-Type: application/json' \
    -d '{"items": [{"question": "What is 2 + 3?", "reference": "5", "completion": "2 + 3 = 5, so \\boxed{5}."}]}'
}

# 1. Images: the Debian base (once), the CPU image on it with the local torch wheel, and Redis.
b0=$(date +%s)
if ! bash "$here/build.sh" "$wheel" cooper:0.1.0 >"$work/build.log" 2>&1; then
  tail -30 "$work/build.log" >&2
  die "build failed"
fi
build_s=$(($(date +%s) - b0)) built=true
say "images built in ${build_s}s"

# 2. The compose file for this machine, and its .env: fresh secrets, the run's name, a free port on loopback.
# The policy and the reward service journal every update: a container stopped or restarted mid-run comes back at the
# version the run recorded (docs/operations.md: "When things die").
python3 "$here/cpu_compose.py" "$repo/docker-compose.yml" -o "$work/docker-compose.yml" --cpus "${CPUS:-1}" \
  --env "COOPER_RUN__STEPS=$steps"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
printf 'COOPER_GRPC_TOKEN=%s\nCOOPER_REDIS_PASSWORD=%s\nCOOPER_RUN_NAME=%s\nREWARD_HTTP_PORT=%s\nCOOPER_CONFIG=%s\n' \
  "$(openssl rand -hex 32)" "$(openssl rand -hex 32)" "$run" "$port" ./configs/tiny.yaml >"$work/smoke.env"
chmod 600 "$work/smoke.env"
dc down -v --remove-orphans >/dev/null 2>&1 || true

# 3. Up: compose starts each service once those it depends on are healthy; docker's events say whether it did. They
# are recorded as they come: `docker events --since` replays only the daemon's last 256, and every health probe is
# an exec that makes three.
docker events --filter type=container --filter "label=com.docker.compose.project=$project" \
  --format '{{json .}}' >"$work/events.jsonl" &
events_pid=$!
up || die "docker-compose up failed"
sleep 1  # the orchestrator's start event
kill "$events_pid" && events_pid=""
if [[ $nodes == 1 ]]; then  # with the policy's nodes started first (up), the file's order is not the one to check
  python3 "$here/compose_checks.py" order "$work/events.jsonl" "$work/docker-compose.yml" || die "start order"
fi
healthy=true
say "healthy in order; the run starts"

# 4. The reward HTTP API through the published port, once the run has a step.
wait_for 1
score | grep -q '"version"' || die "POST /v1/score on 127.0.0.1:$port did not answer with scores"
api=true

# 5. Restart the reward service mid-run: the run waits for it (retries on UNAVAILABLE) and goes on, without the
# orchestrator failing or being restarted.
wait_for 3
restart_at=$logged
dc restart reward >&2
wait_healthy reward || die "the reward service was not healthy again ${timeout_s}s after its restart"
back=$(steps_logged)
wait_for $((back + 2))
[[ $(orchestrator '{{.RestartCount}}') == 0 ]] || die "the orchestrator was restarted after the reward service was"
score | grep -q '"version"' || die "the reward API did not answer after its restart"
restart_survived=true
say "reward restarted at step $restart_at, healthy again at step $back; the run went on to $logged"

# 5b. With two policy nodes: node 1 lost mid-run. Every process of policy-1 but tini is SIGKILLed (its launcher and
# its rank), so tini exits non-zero and compose's restart policy starts the container again; node 0 notices within
# policy.distributed.timeout_s, answers UNAVAILABLE and exits, and is restarted too; the group resumes from its
# checkpoint and update journal, and the orchestrator, which retries UNAVAILABLE, goes on.
if [[ $nodes == 2 ]]; then
  node_kill_survived=false
  wait_for $((logged + 3))
  node_kill_at=$logged
  dc exec -T policy-1 python -c 'import os, signal; os.kill(-1, signal.SIGKILL)' >&2 || true
  deadline=$(($(date +%s) + timeout_s))
  until (($(restarts policy-1) >= 1)) && [[ $(health policy-0) == healthy ]] && (($(restarts policy-0) >= 1)); do
    (($(date +%s) < deadline)) || { dc logs --tail 30 policy-0 policy-1 >&2; die "the policy nodes did not come back"; }
    sleep 2
  done
  back=$(steps_logged)
  wait_for $((back + 3))
  [[ $(orchestrator '{{.RestartCount}}') == 0 ]] || die "the orchestrator was restarted after the node was lost"
  node_kill_survived=true
  say "node 1 lost at step $node_kill_at, both nodes back by step $back; the run went on to $logged"
fi

# 6. down, then up: every container stops (the volumes stay), and the orchestrator resumes the run it finds.
dc down >&2
down_at=$(steps_logged)
((down_at < steps)) || die "the run ended (step $down_at) before down; raise STEPS"
up || die "docker-compose up failed after down"
wait_for "$steps" exit
if [[ $(orchestrator '{{.State.ExitCode}}') != 0 ]]; then
  dc logs --tail 40 orchestrator >&2
  die "the resumed run failed"
fi
dc logs --no-color orchestrator >"$work/orchestrator.log" 2>&1  # to a file: grep -q would cut the pipe (pipefail)
grep -q "resuming run $run" "$work/orchestrator.log" || die "the orchestrator did not resume the run after down/up"
metrics >"$work/metrics.jsonl"
logged=$(python3 "$here/compose_checks.py" steps "$work/metrics.jsonl" "$steps") || die "wrong steps after the resume"
resumed=true
say "down at step $down_at, up, resumed to the end: $logged steps"

# 7. What the run left on the volumes.
on_volume checkpoints ls /mnt/policy /mnt/reward >&2 || die "no checkpoints on the checkpoints volume"
on_volume runs ls "/mnt/$run/checkpoint.json" "/mnt/$run/plot.png" >/dev/null || die "no checkpoint.json or plot.png"
