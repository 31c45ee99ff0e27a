#!/bin/bash
# Harbor verifier: /app/report.csv must equal the expected report (trailing whitespace and
# a final newline aside). Writes /logs/verifier/reward.txt.
mkdir -p /logs/verifier
python3 - <<'PY'
import pathlib
want = pathlib.Path("/tests/expected.csv").read_text().split()
try:
    got = pathlib.Path("/app/report.csv").read_text().split()
except OSError as e:
    got = None
    print(f"FAIL: /app/report.csv: {e.strerror}")
ok = got == want
if got is not None and not ok:
    extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    print(f"FAIL: {len(missing)} expected rows missing {missing[:3]}, {len(extra)} unexpected {extra[:3]}")
print("PASS" if ok else "")
pathlib.Path("/logs/verifier/reward.txt").write_text("1\n" if ok else "0\n")
PY
