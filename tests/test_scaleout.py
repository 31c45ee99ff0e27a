"""The parts of scale-out that need no cluster: identity per node (report flag, compare
refusal), artifacts copied back from a node (bounded, links never followed, paths that would
leave the attempt's folder refused), the image check that names a node, late records kept
out of every figure, the attempt budget. The cluster itself is tested in test_ray_docker.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.core.envelope import envelope_differences, node_name
from harness.engine.node import collect_artifacts, image_problem, receive_artifacts
from harness.engine.runner import attempt_budget
from harness.model.profile import Profile
from harness.report.build import build_report
from harness.report.compare import identity_differences
from tests.test_report import add_attempt, add_run, cli, db  # noqa: F401 (db is a fixture)

V1 = {"executor": "ray", "node_id": "aaaa1111", "hostname": "n1", "kernel": "6.1", "cgroup_version": "1 (hybrid)",
      "cpu_model": "Xeon", "engine_version": "20.10"}
V2 = {**V1, "node_id": "bbbb2222", "hostname": "n2", "cgroup_version": "2"}


def test_differences_name_each_value_and_how_often():
    assert envelope_differences([V1, V1, V2]) == ["cgroup_version: 1 (hybrid) (2), 2 (1)"]
    assert envelope_differences([V1, {**V1, "node_id": "x"}]) == []  # another node, the same machine kind
    assert envelope_differences([V1, {}]) == []  # an older record without facts differs in nothing
    assert node_name(V1) == "n1/aaaa1111" and node_name({"hostname": "h"}) == "h" and node_name({}) == ""


def _mixed_run(store, run_id: str, second: dict) -> None:
    add_run(store, run_id, {"a": "✓✓", "b": "✓✗"}, ks=(1, 2), executor="ray")
    atts = store.attempts(run_id)
    with store.session() as s:  # stamp node facts as a Ray node would have
        from harness.store.orm import AttemptRow

        for a in atts:
            s.get(AttemptRow, a.id).node = V1 if a.slot == 0 else second
        s.commit()


def test_a_run_on_machines_that_differ_is_flagged_and_compare_refuses_it(db):
    store, url = db
    _mixed_run(store, "r-mixed", V2)
    add_run(store, "r-same", {"a": "✓✓", "b": "✓✗"}, ks=(1, 2))
    rep = build_report(store.get_run("r-mixed"), store.attempts("r-mixed")).data()
    assert rep["nodes"]["executor"] == "ray" and [n["node"] for n in rep["nodes"]["nodes"]] == ["n1/aaaa1111", "n2/bbbb2222"]
    assert rep["nodes"]["differ"] == ["cgroup_version: 1 (hybrid) (2), 2 (2)"]
    assert rep["warnings"][0].startswith("scored attempts ran on machines that differ in what a trial measures (cgroup_version")
    blocking, _ = identity_differences(store.get_run("r-same"), store.get_run("r-mixed"), store.attempts("r-same"), store.attempts("r-mixed"))
    assert any("run B (r-mixed) ran on machines that differ: cgroup_version" in b for b in blocking), blocking
    r = cli("compare", "r-same", "r-mixed", "--db", url)
    assert r.exit_code != 0 and "ran on machines that differ" in r.output
    r = cli("report", "r-mixed", "--db", url)
    assert r.exit_code == 0 and "nodes" in r.stdout and "differ" in r.stdout


def test_nodes_of_one_kind_are_not_flagged(db):
    store, _ = db
    _mixed_run(store, "r-two", {**V1, "node_id": "cccc3333", "hostname": "n3"})
    rep = build_report(store.get_run("r-two"), store.attempts("r-two")).data()
    assert rep["nodes"]["differ"] == [] and not any("differ" in w for w in rep["warnings"])


def test_a_late_record_is_evidence_and_in_no_figure(db):
    store, url = db
    add_run(store, "r-late", {"a": "✓✗"}, ks=(1,))
    before = json.loads(cli("report", "r-late", "--format", "json", "--db", url).stdout)
    late = store.attempts("r-late")[1].model_copy(update={"outcome": "pass", "failure_kind": None, "id": None})
    store.add_late(late)  # a record for slot 1 that says pass, after the slot was already filled
    after = json.loads(cli("report", "r-late", "--format", "json", "--db", url).stdout)
    assert after["suite"]["pass@1"] == before["suite"]["pass@1"]
    assert after["attempts"] == before["attempts"] and after["late_attempts"] == 1
    assert any("arrived late" in w for w in after["warnings"])
    assert len(store.attempts("r-late")) == 2 and len(store.late_attempts("r-late")) == 1
    assert store.purge_runs(["r-late"])["late attempts"] == 1


def test_artifacts_copy_back_regular_files_within_the_cap(tmp_path):
    node = tmp_path / "node" / "a" / "slot0-attempt1"
    (node / "grade").mkdir(parents=True)
    (node / "stdout.txt").write_bytes(b"x" * 10)
    (node / "grade" / "state.tar").write_bytes(b"y" * 20)
    secret = tmp_path / "secret"
    secret.write_text("host file")
    os.symlink(secret, node / "link")  # a link in an attempt's folder is never followed or sent
    files, left = collect_artifacts(node, cap=1000)
    assert sorted(f[0] for f in files) == ["grade/state.tar", "stdout.txt"] and not left
    assert node.is_dir(), "the node keeps its copy until the driver's end-of-run sweep"
    dest = tmp_path / "driver" / "a" / "slot0-attempt1"
    assert receive_artifacts(dest, files) == []
    assert (dest / "grade" / "state.tar").read_bytes() == b"y" * 20
    # over the cap: what fits is sent, the rest stays on the node (and the folder with it)
    import shutil

    shutil.rmtree(node)
    (node / "grade").mkdir(parents=True)
    (node / "big").write_bytes(b"z" * 50)
    (node / "grade" / "small").write_bytes(b"s" * 5)
    files, left = collect_artifacts(node, cap=20)
    assert [f[0] for f in files] == ["grade/small"] and left and (node / "big").exists()


def test_paths_that_would_leave_the_attempt_folder_are_refused(tmp_path):
    dest = tmp_path / "att"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    dest.mkdir()
    os.symlink(outside, dest / "out")
    bad = [("../escape", b"1", 0o644), ("/abs", b"1", 0o644), ("a/../../x", b"1", 0o644), ("out/x", b"1", 0o644), ("", b"", 0o644)]
    assert receive_artifacts(dest, [*bad, ("ok.txt", b"fine", 0o644)]) == [b[0] for b in bad]
    assert (dest / "ok.txt").read_bytes() == b"fine"
    assert list(outside.iterdir()) == [] and not (tmp_path / "escape").exists()


def test_image_check_names_the_node_and_the_fix():
    want = {"id": "sha256:1", "inputs": "abc"}
    assert image_problem("n1 (aaaa)", "harness/refunds:latest", want, {"id": "sha256:2", "inputs": "abc"}) is None  # same inputs
    why = image_problem("n1 (aaaa)", "harness/refunds:latest", want, {"id": "sha256:2", "inputs": "zzz"})
    assert why.startswith("node n1 (aaaa): image harness/refunds:latest was built from other inputs (zzz != abc)")
    assert "missing" in image_problem("n1 (aaaa)", "img", want, None)
    assert image_problem("n", "my/agent", {"id": "sha256:1", "inputs": ""}, {"id": "sha256:1", "inputs": ""}) is None
    assert "another image" in image_problem("n", "my/agent", {"id": "sha256:1", "inputs": ""}, {"id": "sha256:9", "inputs": ""})


def test_attempt_budget_is_the_timeouts_plus_a_margin(monkeypatch):
    p = Profile.model_validate({"name": "x", "timeouts": {"setup": 10, "agent": 100, "grade": 5}})
    monkeypatch.delenv("HARNESS_RAY_MARGIN_S", raising=False)
    assert attempt_budget(p) == 10 + 100 + 2 * 5 + 300
    monkeypatch.setenv("HARNESS_RAY_MARGIN_S", "0")
    assert attempt_budget(p) == 120


def test_ray_options_without_ray_are_one_line_errors(tmp_path):
    r = cli("run", "--suite", "refunds", "--ray-address", "10.0.0.1:6379")
    assert r.exit_code != 0 and "--ray-address joins a Ray cluster: give --executor ray with it" in r.output
    r = cli("run", "--suite", "refunds", "--executor", "k8s")
    assert r.exit_code != 0 and "--executor 'k8s': one of local, ray" in r.output


def test_a_dead_holder_survives_a_lease_that_does_not_clear_it(tmp_path, monkeypatch):
    """doctor, sandbox exec or a partial multi-core lease take a core without clearing what a
    dead holder left: its name must still be there for the next lease that does."""
    from harness.engine.scheduler import CpuPool
    from harness.sandbox.owners import controller_host
    from tests.conftest import dead_core_holder

    monkeypatch.setenv("HARNESS_LOCK_DIR", str(tmp_path / "locks"))
    pid = dead_core_holder(0)
    with CpuPool(cpus=[0], reserved=[]).leased(1):  # a doctor-style lease: takes the core, clears nothing
        pass
    pool = CpuPool(cpus=[0], reserved=[])
    got = pool.lease(1, timeout=5)
    assert pool.take_stale(got) == {0: f"{controller_host()}:{pid}"}
    pool.release(got)
    got = pool.lease(1, timeout=5)
    assert pool.take_stale(got) == {}, "taken and released cleanly: gone"
    pool.release(got)


def test_an_address_where_nothing_answers_fails_at_once():
    import time

    t0 = time.monotonic()
    r = cli("doctor", "--executor", "ray", "--ray-address", "127.0.0.1:1")
    assert r.exit_code == 1 and "nothing answers at 127.0.0.1:1" in " ".join(r.output.split()), r.output
    assert time.monotonic() - t0 < 60, "Ray's own retries (minutes) were not cut short"
    r = cli("doctor", "--executor", "ray", "--ray-address", "no-port-here")
    assert r.exit_code == 1 and "give HOST:PORT" in " ".join(r.output.split()), r.output


def test_node_counts_are_the_same_from_whole_and_lean_records(db):
    """Per machine: attempts, clean and discarded, counted by hand, from whole records (a
    dict per attempt) and from a lean read (one dict per distinct stored value)."""
    from harness.store.orm import AttemptRow
    from harness.store.store import REPORT_FIELDS

    store, _ = db
    add_run(store, "r-disc", {"a": "✓✗✓", "b": "·✓✗"}, ks=(1, 2), discards={"a": 2}, max_reruns=2, executor="ray")
    atts = store.attempts("r-disc")
    with store.session() as s:
        for a in atts:
            s.get(AttemptRow, a.id).node = V1 if a.slot != 1 else (V2 if a.task_id == "a" else {})
        s.commit()
    atts = store.attempts("r-disc")
    want: dict[str, list[int]] = {}
    for a in atts:
        if a.node:
            w = want.setdefault(node_name(a.node), [0, 0, 0])
            w[0] += 1
            w[1 if a.verdict == "clean" else 2] += 1
    assert sum(w[2] for w in want.values()) > 0 and len(want) == 2
    run = store.get_run("r-disc")
    for records in (atts, store.attempts("r-disc", REPORT_FIELDS)):
        got = build_report(run, records).data()["nodes"]["nodes"]
        assert {n["node"]: [n["attempts"], n["clean"], n["discarded"]] for n in got} == want
