"""Checks /app/report.json against the values computed from the original log."""
import json, os

EXPECTED = {"requests": 2375, "unique_ips": 101, "top_path": "/health", "status_5xx": 159, "bytes_total": 57974334}
results = []


def check(name, ok, msg=""):
    results.append({"name": name, "status": "passed" if ok else "failed", "duration": 0, **({} if ok else {"message": msg})})


try:
    report = json.load(open("/app/report.json"))
    check("report is a JSON object", isinstance(report, dict), f"got {type(report).__name__}")
except (OSError, ValueError) as e:
    report = {}
    check("report is a JSON object", False, str(e))
for key, want in EXPECTED.items():
    got = report.get(key) if isinstance(report, dict) else None
    check(f"{key} = {want!r}", got == want, f"got {got!r}")
check("no other keys", isinstance(report, dict) and set(report) <= set(EXPECTED), f"extra keys {sorted(set(report) - set(EXPECTED))}")
passed = sum(r["status"] == "passed" for r in results)
with open("/logs/verifier/ctrf.json", "w") as f:
    json.dump({"results": {"tool": {"name": "check.py"}, "summary": {"tests": len(results), "passed": passed,
               "failed": len(results) - passed}, "tests": results}}, f)
with open("/logs/verifier/reward.txt", "w") as f:
    f.write("1\n" if passed == len(results) else "0\n")
print(f"{passed}/{len(results)} checks passed")
