#!/usr/bin/env bash
# End to end: Debian's Prometheus server, on loopback, scrapes lifeline-agent while it supervises a
# drill in which rank 1 crashes; the restart must be visible through Prometheus' HTTP API as
# lifeline_restarts_total >= 1, and the dead anomaly as lifeline_anomalies_total{kind="dead",rank="1"}.
# Usage: prometheus_e2e.sh AGENT DRILL
set -euo pipefail
agent="$1" drill="$2"
py=/usr/bin/python3
work="$(mktemp -d /tmp/lifeline-prom-e2e.XXXXXX)"
agent_pid="" prom_pid=""
cleanup() {
  set +e  # a rank or server that exits non-zero on SIGTERM must not fail a test that passed
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null && wait "$agent_pid" 2>/dev/null
  [ -n "$prom_pid" ] && kill "$prom_pid" 2>/dev/null && wait "$prom_pid" 2>/dev/null
  rm -rf "$work"
  return 0
}
trap cleanup EXIT
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
agent_port="$(free_port)"
prom_port="$(free_port)"

cat >"$work/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: lifeline
    static_configs:
      - targets: ["127.0.0.1:$agent_port"]
YAML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" --log.level=warn >"$work/prometheus.log" 2>&1 &
prom_pid=$!

"$agent" run --nproc 4 --run-dir "$work/run" --metrics-addr "127.0.0.1:$agent_port" --max-restarts 2 \
  -- "$drill" --dir "$work/ckpt" --steps 3000 --ckpt-every 100 --compute-ms 2 --fault crash@1:50 \
  >"$work/agent.out" 2>&1 &
agent_pid=$!

query() {
  "$py" - "$prom_port" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
url = "http://127.0.0.1:%s/api/v1/query?query=%s" % (sys.argv[1], urllib.parse.quote(sys.argv[2]))
try:
    data = json.load(urllib.request.urlopen(url, timeout=2))
except Exception:
    sys.exit(1)
results = data.get("data", {}).get("result", [])
print(max([float(r["value"][1]) for r in results], default=-1))
PY
}

restarts=-1 dead=-1
for _ in $(seq 1 120); do
  restarts="$(query 'max(lifeline_restarts_total{job="lifeline"})' || echo -1)"
  dead="$(query 'max(lifeline_anomalies_total{job="lifeline",kind="dead",rank="1"})' || echo -1)"
  if "$py" -c "import sys; sys.exit(0 if float('$restarts') >= 1 and float('$dead') >= 1 else 1)"; then break; fi
  sleep 0.5
done
echo "through Prometheus: lifeline_restarts_total=$restarts, lifeline_anomalies_total{kind=dead,rank=1}=$dead"
"$py" -c "import sys; sys.exit(0 if float('$restarts') >= 1 and float('$dead') >= 1 else 1)" || {
  echo "FAIL: the restart never reached Prometheus"; tail -5 "$work/prometheus.log"; tail -20 "$work/agent.out"; exit 1; }
up="$(query 'up{job="lifeline"}')"
[ "$up" = "1.0" ] || { echo "FAIL: target not up ($up)"; exit 1; }
echo "PASS"
