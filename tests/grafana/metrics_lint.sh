#!/usr/bin/env bash
# A real scrape of lifeline-agent supervising lifeline-drill (with a straggler, so the anomaly
# families carry samples) passes `promtool check metrics` with nothing to say, carries every
# family docs/metrics.md documents, and every metric the dashboard and the alert rules use exists in it.
# Usage: metrics_lint.sh AGENT DRILL SOURCE_DIR
set -euo pipefail
agent="$1" drill="$2" src="$3"
py=/usr/bin/python3
work="$(mktemp -d /tmp/lifeline-metrics-lint.XXXXXX)"
agent_pid=""
cleanup() {
  set +e  # a rank or server that exits non-zero on SIGTERM must not fail a test that passed
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  rm -rf "$work"
  return 0
}
trap cleanup EXIT
port="$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$agent" run --nproc 4 --run-dir "$work/run" --metrics-addr "127.0.0.1:$port" --events-log "$work/events.jsonl" \
  -- "$drill" --dir "$work/ckpt" --steps 400 --ckpt-every 20 --fault slow@3:20:30 >"$work/agent.out" 2>&1 &
agent_pid=$!

# Scrape once the straggler has been reported (the anomaly counter for rank 3 is non-zero).
scrape="$work/scrape.txt"
for _ in $(seq 1 300); do
  if "$py" - "$port" >"$scrape" 2>/dev/null <<'PY'
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=2).read().decode()
print(text, end="")
ok = any(l.startswith('lifeline_anomalies_total{kind="straggler",rank="3"}') and float(l.split()[-1]) > 0
         for l in text.splitlines())
sys.exit(0 if ok else 1)
PY
  then break; fi
  sleep 0.1
done
grep -q 'lifeline_anomalies_total{kind="straggler",rank="3"}' "$scrape" || {
  echo "FAIL: no straggler in the scrape"; cat "$work/agent.out" | tail -20; exit 1; }

lint="$(promtool check metrics <"$scrape" 2>&1)" || { echo "FAIL: promtool check metrics: $lint"; exit 1; }
if [ -n "$lint" ]; then echo "FAIL: promtool check metrics reports:"; echo "$lint"; exit 1; fi
echo "promtool check metrics: clean ($(grep -c '^# TYPE' "$scrape") families)"

"$py" "$src/tests/grafana/check_names.py" --exposition "$scrape" --readme "$src/docs/metrics.md" \
  "$src"/grafana/dashboards/*.json "$src"/grafana/alerts/*.rules.yml
wait "$agent_pid"
rc=$?
agent_pid=""
[ "$rc" -eq 0 ] || { echo "FAIL: agent exited $rc"; tail -20 "$work/agent.out"; exit 1; }
echo "PASS"
