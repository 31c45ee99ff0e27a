#!/usr/bin/env bash
# Make sure a Docker engine answers. Idempotent: a no-op when one already does.
#   - installs Debian's docker.io when dockerd is missing (root only; one apt-get update)
#   - starts dockerd in the background, pid in $HARNESS_DOCKERD_PIDFILE, log beside it
#   - waits until the engine answers (up to $HARNESS_ENGINE_WAIT seconds, default 60)
# Stop what this script started with: docker/engine.sh stop
set -euo pipefail

PIDFILE=${HARNESS_DOCKERD_PIDFILE:-/var/run/harness-dockerd.pid}
LOG=${HARNESS_DOCKERD_LOG:-/var/log/harness-dockerd.log}
WAIT=${HARNESS_ENGINE_WAIT:-60}

answers() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if [[ "${1:-}" == "stop" ]]; then
  if [[ -s "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    pid=$(cat "$PIDFILE"); kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    echo "engine: stopped dockerd (pid $pid)"
  else
    echo "engine: no dockerd started by harness is running"
  fi
  exit 0
fi

if [[ -n "${DOCKER_HOST:-}" ]] && answers; then
  echo "engine: answering at DOCKER_HOST=$DOCKER_HOST"; exit 0
fi
if command -v docker >/dev/null && answers; then
  echo "engine: answering ($(docker version --format '{{.Server.Version}}'))"; exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "engine: no Docker engine answers and starting one needs root." >&2
  echo "        run 'sudo make engine', or start Docker yourself and make sure 'docker version' works." >&2
  exit 1
fi

if ! command -v dockerd >/dev/null; then
  echo "engine: installing Debian's docker.io (apt-get)..."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends docker.io iptables >/dev/null
fi

if [[ -S /var/run/docker.sock ]] && ! answers; then
  # a stale socket from a dead daemon would make dockerd refuse to start
  if ! pgrep -x dockerd >/dev/null; then rm -f /var/run/docker.sock; fi
fi

if ! pgrep -x dockerd >/dev/null; then
  # Keep the engine's own threads (dockerd, containerd, the per-container shims that pump a
  # trial's output) on the cores reserved for the controller: otherwise their work lands on
  # a trial's pinned core and is measured as foreign CPU. Containers are unaffected (joining
  # their cpuset cgroup resets their affinity). Default: cpu 0 when the machine has >1 cpu;
  # HARNESS_ENGINE_CPUS=all leaves the engine unpinned.
  ENGINE_CPUS=${HARNESS_ENGINE_CPUS:-}
  if [[ -z "$ENGINE_CPUS" && $(nproc) -gt 1 ]]; then ENGINE_CPUS=$(python3 -c "import os; print(min(os.sched_getaffinity(0)))" 2>/dev/null || echo 0); fi
  PIN=()
  if [[ -n "$ENGINE_CPUS" && "$ENGINE_CPUS" != "all" ]] && command -v taskset >/dev/null; then PIN=(taskset -c "$ENGINE_CPUS"); fi
  echo "engine: starting dockerd (log: $LOG${PIN:+, engine pinned to cpu $ENGINE_CPUS})"
  mkdir -p "$(dirname "$LOG")"
  # setsid: the daemon must not die with the shell (or make) that started it
  setsid "${PIN[@]}" dockerd --pidfile "$PIDFILE" >>"$LOG" 2>&1 < /dev/null &
fi

for _ in $(seq 1 $((WAIT * 5))); do
  if answers; then
    echo "engine: ready ($(docker version --format '{{.Server.Version}}'))"; exit 0
  fi
  sleep 0.2
done
echo "engine: dockerd did not answer within ${WAIT}s; last log lines:" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
