#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import collections, json, re
pat = re.compile(r'^(\d+\.\d+\.\d+\.\d+) \S+ \S+ \[[^\]]+\] "(\S+) (\S+) [^"]*" (\d{3}) (\d+) ')
n, ips, paths, s5, total = 0, set(), collections.Counter(), 0, 0
for line in open("/app/access.log"):
    m = pat.match(line)
    if not m:
        continue
    n += 1
    ips.add(m.group(1))
    paths[m.group(3)] += 1
    s5 += int(m.group(4)) >= 500
    total += int(m.group(5))
top = sorted(paths.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
json.dump({"requests": n, "unique_ips": len(ips), "top_path": top, "status_5xx": s5, "bytes_total": total}, open("/app/report.json", "w"))
PY
