#!/usr/bin/env bash
# lifeline-sim as a user runs it (issue 22): a small simulated job with faults gives the JSON
# fields the README names, every culprit right and no false alarm, and --plot writes a PNG (it
# needs python3-matplotlib, which tools/setup installs).
set -euo pipefail
sim="$1"
dir="$(mktemp -d /tmp/lifeline-sim-cli-XXXXXX)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$sim" --ranks 64 --nodes 8 --drills 12 --seed 5 --json --plot "$dir/sim.png" > "$dir/sim.json" \
  || fail "lifeline-sim exited $?"
/usr/bin/python3 - "$dir/sim.json" <<'PY' || fail "bad JSON: $(cat "$dir/sim.json")"
import json, sys
d = json.load(open(sys.argv[1]))
for key in ("accuracy", "false_alarms", "drills", "ranks", "nodes", "seed"):
    assert key in d, key
assert d["drills"] == 12 and d["ranks"] == 64 and d["nodes"] == 8, d
assert d["accuracy"] == 1.0 and d["false_alarms"] == 0, d
leader = d["cpu"]["leader"]  # what one leader takes: its view's CPU and the summaries' bytes
assert leader["cpu_seconds_per_second"] > 0 and 0 < leader["summary_bytes_per_rank_second"] < 1000, leader
PY
[ "$(head -c 4 "$dir/sim.png" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "no PNG at $dir/sim.png"
echo "lifeline-sim: JSON and plot OK"
