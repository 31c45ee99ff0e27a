"""``harness doctor``: can this machine run pinned trials? Each problem comes with its fix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import harness


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""


def wanted_images() -> list[str]:
    """Every image a run of the built-in suites needs: the base, the harness's own, each native
    suite's image and each per-task (Harbor format) image."""
    from harness.engine.suites import builtin_suites, load_suite
    from harness.sandbox.images import BASE_IMAGE, HARNESS_IMAGES, SANDBOX_IMAGE

    wanted = [BASE_IMAGE, SANDBOX_IMAGE, *HARNESS_IMAGES]
    for name in builtin_suites():
        s = load_suite(name)
        wanted += [t.image for t in s.tasks if t.build is not None and t.image]  # built per task (Harbor format)
        if s.image and any(t.build is None for t in s.tasks):
            wanted.append(s.image)
    return list(dict.fromkeys(wanted))


def run_checks() -> list[Check]:
    from harness.engine.command import run_command
    from harness.engine.profiles import load_profile
    from harness.engine.scheduler import CpuPool, allowed_cpus, default_reserved
    from harness.measure import host as hoststats
    from harness.model.errors import EngineError
    from harness.sandbox.docker_backend import DockerBackend
    from harness.sandbox.docker_sandbox import can_spare_from_oom_killer, connect, image_present
    from harness.sandbox.gateway import firewall_check
    from harness.sandbox.images import GATEWAY_IMAGE, SANDBOX_IMAGE

    out: list[Check] = [Check("harness", "ok", f"version {harness.__version__}")]
    facts = hoststats.host_facts()
    cgv = str(facts.get("cgroup_version", "?"))
    out.append(
        Check(
            "cgroup",
            "ok",
            f"version {cgv}" + (" (v1 controllers with a cgroup2 mount: per-cgroup PSI via /sys/fs/cgroup/unified)" if "hybrid" in cgv else ""),
        )
    )
    psi = all(Path(f"/proc/pressure/{r}").exists() for r in ("cpu", "memory", "io"))
    out.append(
        Check("host PSI", "ok" if psi else "warn", "/proc/pressure/{cpu,memory,io} readable" if psi else "no /proc/pressure",
              "" if psi else "boot with psi=1 (CONFIG_PSI); host pressure rules are then skipped")
    )
    cpus = allowed_cpus()
    res = default_reserved(cpus)
    pool = CpuPool.for_host()
    out.append(
        Check(
            "cores",
            "ok" if pool.size >= 1 else "fail",
            f"{len(cpus)} usable ({','.join(map(str, cpus))}); {res} reserved for the controller; "
            f"{pool.size} for trials -> {pool.size} concurrent 1-core attempts",
            "" if pool.size >= 1 else "run on a machine with at least 1 core to spare, or --reserve-cores 0",
        )
    )
    try:
        client = connect(timeout=15)
    except EngineError as e:
        out.append(Check("engine", "fail", str(e), "make engine   (installs docker.io and starts dockerd; needs root)"))
        return out
    v = client.version()
    info = client.info()
    out.append(Check("engine", "ok", f"Docker {v.get('Version')} (API {v.get('ApiVersion')}), storage {info.get('Driver')}"))
    driver = info.get("CgroupDriver", "?")
    out.append(Check("cgroup driver", "ok", f"{driver} (engine reports cgroup v{info.get('CgroupVersion', '?')})"))
    missing = [img for img in wanted_images() if not image_present(client, img)]
    out.append(
        Check("images", "fail" if missing else "ok", f"missing: {', '.join(missing)}" if missing else "base, harness and suite images present",
              "make images" if missing else "")
    )
    if GATEWAY_IMAGE not in missing:
        why = firewall_check(client)
        out.append(Check("network policies", "warn" if why else "ok",
                         why or "none, gateway, allowlist and bridge available (bridge kept off the host by firewall rules)",
                         "`bridge` runs are refused here; use gateway or allowlist (or an engine with iptables enabled)" if why else ""))
    if SANDBOX_IMAGE not in missing:
        prof = load_profile("standard")
        with pool.leased(1) as lease:
            r = run_command(DockerBackend(client), SANDBOX_IMAGE, prof, lease, ["python3", "-c", "sum(range(10**6))"], timeout=30)
        if r.kind != "ok":
            out.append(Check("counters", "fail", f"test container: {r.kind} {r.error or ''}", "see `harness sandbox exec -- true`"))
        else:
            c = r.counters
            ok = c is not None and c.cpu_usage_us > 0
            out.append(
                Check(
                    "counters",
                    "ok" if ok else "fail",
                    f"read from a real container: cpu {c.cpu_usage_us if c else '-'} us, memory peak "
                    f"{c.memory_peak if c else '-'} B, pids peak {c.pids_peak if c else '-'}",
                    "" if ok else "the container's cgroup could not be read; run as root on the Docker host",
                )
            )
            cg_psi = c is not None and c.psi_cpu_some_us is not None
            out.append(Check("cgroup PSI", "ok" if cg_psi else "warn", "per-cgroup pressure files readable" if cg_psi else "no per-cgroup PSI on this host",
                             "" if cg_psi else "needs cgroup v2 (or a hybrid cgroup2 mount) with PSI; per-cgroup pressure is then not recorded"))
            spared = can_spare_from_oom_killer()
            out.append(Check("OOM killer", "ok" if spared else "warn",
                             "a sandbox's init and keeper are spared (oom_score_adj -1000): the ceiling takes workload processes only"
                             if spared else "the controller lacks CAP_SYS_RESOURCE: the OOM killer may take a sandbox's keeper, and a "
                             "workload at its memory ceiling then ends its container (still recorded as the agent's OOM failure)",
                             "" if spared else "run the controller as root on the Docker host (with CAP_SYS_RESOURCE)"))
            env = r.envelope
            out.append(
                Check(
                    "envelope read-back",
                    "ok" if env and env.ok else "fail",
                    "quota, cpuset, memory+swap, pids read back equal the profile" if env and env.ok else "; ".join(env.mismatches if env else ["no cgroup"]),
                    "" if env and env.ok else "the engine does not apply limits (rootless? no cgroup controllers delegated?)",
                )
            )
    return out


def node_checks(reserve: int | None = None) -> list[dict]:
    """This machine's checks as plain data (what a Ray node sends back to the driver)."""
    from harness.engine.scheduler import CpuPool
    from harness.sandbox.docker_sandbox import connect
    from harness.sandbox.images import BASE_IMAGE, SANDBOX_IMAGE, image_labels, INPUTS_LABEL

    checks = [c.__dict__ for c in run_checks()]
    inputs: dict = {}
    try:
        client = connect(timeout=15)
        for img in (BASE_IMAGE, SANDBOX_IMAGE):
            labels = image_labels(client, img)
            inputs[img] = (labels or {}).get(INPUTS_LABEL, "") if labels is not None else None
    except Exception:
        pass
    try:
        cores = CpuPool.for_host(reserve=reserve).size
    except Exception:
        cores = 0
    import socket

    return [*checks, {"name": "_facts", "status": "ok", "detail": "", "fix": "", "cores": cores, "inputs": inputs,
                      "hostname": socket.gethostname()}]


def ray_checks(address: str | None, reserve: int | None = None) -> list[tuple[str, list[Check]]]:
    """``harness doctor --executor ray``: the cluster (Ray, its nodes, their harness cores),
    then every node's own checks, run on that node; images whose inputs differ between nodes."""
    from harness.engine import ray_executor as rx
    from harness.model.errors import HarnessError, RunError

    head: list[Check] = []
    try:
        rx.ray_module()
    except RunError as e:
        return [("cluster", [Check("ray", "fail", str(e), "pip install 'harness[ray]'")])]
    head.append(Check("ray", "ok", f"Ray {rx.version()}; usage reporting off (RAY_USAGE_STATS_ENABLED=0)"))
    try:
        joined = rx.connect(address, cores=1)
    except HarnessError as e:
        return [("cluster", [*head, Check("cluster", "fail", str(e), "start the head with `ray start --head` and pass --ray-address HOST:PORT")])]
    live = rx.nodes()
    offering = [n for n in live if n["harness_cores"] > 0]
    head.append(Check("cluster", "ok" if offering else "fail", f"{joined}: {len(live)} live node(s), {len(offering)} offering "
                      f"{sum(n['harness_cores'] for n in offering)} {rx.RESOURCE}",
                      "" if offering else f"start nodes with `ray start --address {joined} --resources '{{\"{rx.RESOURCE}\": N}}'`"))
    answers = rx.on_every_node(node_checks, reserve)
    out: list[tuple[str, list[Check]]] = [("cluster", head)]
    seen_inputs: dict[str, dict[str, str]] = {}
    for n in live:
        ans = answers.get(n["node_id"])
        host = next((c.get("hostname") for c in ans if c.get("name") == "_facts"), None) if isinstance(ans, list) else None
        name = f"{host or n['address']}/{n['node_id'][:8]}"
        if isinstance(ans, BaseException) or ans is None:
            out.append((name, [Check("node", "fail", f"did not answer: {type(ans).__name__ if ans else 'no reply'}: {str(ans)[:200]}",
                                     "is harness installed in the Python the node's Ray workers use?")]))
            continue
        facts = next((c for c in ans if c["name"] == "_facts"), {})
        checks = [Check(c["name"], c["status"], c["detail"], c["fix"]) for c in ans if c["name"] != "_facts"]
        offered, cores = n["harness_cores"], facts.get("cores", 0)
        if offered <= 0:
            checks.append(Check(rx.RESOURCE, "warn", "offers none: runs no attempt",
                                f"restart it with `ray start ... --resources '{{\"{rx.RESOURCE}\": {cores}}}'`"))
        elif offered > cores:
            checks.append(Check(rx.RESOURCE, "fail", f"offers {offered} but has {cores} cores to lease: attempts would queue there",
                                f"restart it with --resources '{{\"{rx.RESOURCE}\": {cores}}}'"))
        else:
            checks.append(Check(rx.RESOURCE, "ok", f"offers {offered} of its {cores} leasable cores"))
        for img, inp in (facts.get("inputs") or {}).items():
            if inp:
                seen_inputs.setdefault(img, {})[name] = inp
        out.append((name, checks))
    for img, by_node in seen_inputs.items():
        if len(set(by_node.values())) > 1:
            head.append(Check("images", "fail", f"{img} differs between nodes: " + ", ".join(f"{k} {v[:12]}" for k, v in by_node.items()),
                              "rebuild it on every node from the same checkout (`make images`)"))
    return out
