#!/usr/bin/env bash
# Runs inside the cgroup v2 guest that tests/guest/cgroup2.py boots (`make test-cgroup2`),
# from the read-only 9p share of the checkout, in one of two modes (HARNESS_GUEST_MODE):
#   provision  load the host's saved images into the engine (the host keeps the disk), stop
#   test       build what the guest builds itself, run doctor and the tests; JUnit to /mnt/out
# Its exit status is the tests'. Prints timings so the host can show where the time goes.
set -uo pipefail
# one function, parsed whole before it runs: editing the checkout meanwhile cannot change it
main() {
  say() { echo "[$(cut -d' ' -f1 /proc/uptime)s] $*"; }
  # shellcheck disable=SC1091
  set -a; . /mnt/in/env; set +a
  # this boot's: the host trusts the status file only next to it
  echo "$HARNESS_GUEST_NONCE" > /mnt/out/nonce
  export PATH=/opt/harness-venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 CI=1 HARNESS_REQUIRE_DOCKER=1 HARNESS_IN_GUEST=1

  say "kernel $(uname -r); cgroup fs $(stat -fc %T /sys/fs/cgroup); controllers: $(cat /sys/fs/cgroup/cgroup.controllers); $(nproc) CPUs"
  engine_up || return 1

  if [ "$HARNESS_GUEST_MODE" = provision ]; then
    say "loading the host's images: $HARNESS_GUEST_IMAGES"
    docker load -q -i /dev/disk/by-id/virtio-host-images || return 1
    # the host keeps this disk: stop the engine cleanly and write everything out
    systemctl stop docker.socket docker.service containerd.service
    sync
    say "images loaded"
    return 0
  fi

  # the share is read-only and tests write caches: work on a copy of the checkout
  # (at the host's path: per-task image tags carry a digest of the suite's path)
  mkdir -p "$HARNESS_GUEST_ROOT"
  tar -C /mnt/project --exclude=./.venv --exclude=./.git --exclude=./.harness --exclude=__pycache__ \
      --exclude=./.pytest_cache --exclude=./.hypothesis --exclude=./bench-results -cf - . | tar -C "$HARNESS_GUEST_ROOT" -xf - || return 1
  cd "$HARNESS_GUEST_ROOT" || return 1
  export PYTHONPATH=$HARNESS_GUEST_ROOT HARNESS_HOME=/root/harness-home

  say "building what the guest builds itself (the loaded base and mirror-bound images must be up to date)"
  out=$(harness images build --suite refunds --suite hostile) || { echo "$out"; return 1; }
  echo "$out"
  for image in $HARNESS_GUEST_IMAGES; do
    if echo "$out" | awk -v t="$image" '$1 == t && /built in/ {found=1} END {exit !found}'; then
      say "$image was rebuilt: its inputs computed in the guest differ from the host's"; return 1
    fi
  done

  say "harness doctor"
  harness doctor || true

  say "pytest (the live cgroup tests, the real-container sandbox tests, the guest's v2 checks)"
  # HARNESS_GUEST_PYTEST is split into words on purpose (extra pytest arguments, e.g. -x)
  # shellcheck disable=SC2086
  python -m pytest -p no:cacheprovider -q -rA --junitxml=/mnt/out/junit.xml -o junit_suite_name=cgroup2-guest \
      tests/test_cgroup_parse.py tests/test_hoststats.py tests/test_sandbox_docker.py tests/test_oneshot_docker.py tests/guest \
      $HARNESS_GUEST_PYTEST
  rc=$?
  say "pytest exit $rc"

  # the same reads under Docker's other driver: cgroupfs names a container's cgroup
  # /docker/<id> (no systemd scope); the engine restarts with it and the locating tests rerun
  say "restarting the engine with the cgroupfs driver"
  printf '{"exec-opts": ["native.cgroupdriver=cgroupfs"], "log-level": "warn"}\n' > /etc/docker/daemon.json
  systemctl restart docker.service || return 1
  engine_up || return 1
  [ "$(docker info --format '{{.CgroupDriver}}')" = cgroupfs ] || { say "the engine did not switch to cgroupfs"; return 1; }
  python -m pytest -p no:cacheprovider -q -rA --junitxml=/mnt/out/junit-cgroupfs.xml -o junit_suite_name=cgroup2-guest-cgroupfs \
      tests/guest/test_v2_guest.py::test_a_sandbox_cgroup_is_the_containers_own_with_every_file \
      tests/test_cgroup_parse.py::test_live_docker_container_limits_read_back \
      tests/test_sandbox_docker.py::test_limits_read_back_equal_the_profile \
      tests/test_sandbox_docker.py::test_oom_is_recorded_from_the_kernel_not_the_exit_code \
      tests/test_sandbox_docker.py::test_half_cpu_quota_throttles_about_half_the_wall_time \
      tests/test_oneshot_docker.py::test_exit_statuses_output_and_counters_are_the_commands
  rc2=$?
  say "pytest (cgroupfs driver) exit $rc2"
  [ "$rc" = 0 ] || return $rc
  return $rc2
}

engine_up() {
  for _ in $(seq 180); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { say "the guest's Docker engine did not answer"; systemctl status docker --no-pager | tail -20; return 1; }
  say "docker $(docker info --format '{{.ServerVersion}}, cgroup driver {{.CgroupDriver}}, cgroup v{{.CgroupVersion}}')"
}

main "$@"; exit $?
