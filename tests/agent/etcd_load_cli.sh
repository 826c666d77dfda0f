#!/usr/bin/env bash
# lifeline-etcd-load as the README runs it (issue 36), at a size this machine takes in seconds: a
# real etcd and 24 agents speaking the agents' protocol all join one round (its plan, 24 entries,
# is past the size at which it is stored compressed, so every agent read a compressed plan), the
# leader receives the summaries straight, and the replay of the agents before issue 36 gives its
# own figures, with summaries larger than the binary ones.
set -euo pipefail
load="$1"
dir="$(mktemp -d /tmp/lifeline-etcd-load-XXXXXX)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$load" --agents 24 --seconds 3 --protocol watch --join-timeout 60 --json > "$dir/watch.json" \
  || fail "lifeline-etcd-load --protocol watch exited $?"
"$load" --agents 24 --seconds 3 --protocol before --join-timeout 60 --json > "$dir/before.json" \
  || fail "lifeline-etcd-load --protocol before exited $?"
/usr/bin/python3 - "$dir/watch.json" "$dir/before.json" <<'PY' || fail "bad figures: $(cat "$dir"/*.json)"
import json, sys
watch, before = (json.load(open(p)) for p in sys.argv[1:3])
for d in (watch, before):
    for key in ("etcd_requests_per_second", "etcd_cpu_cores", "probe_put_ms", "joined", "summary_bytes"):
        assert key in d, key
assert watch["joined"] == 24 and watch["joined_by_window_end"] == 24, watch
assert watch["leader_summary_bytes_in_per_second"] > 0, watch
assert watch["summary_bytes"] * 2 < before["summary_bytes"], (watch["summary_bytes"], before["summary_bytes"])
assert before["protocol"] == "before" and before["joined"] >= 1, before
PY
echo "lifeline-etcd-load: both protocols measured, every agent joined"
