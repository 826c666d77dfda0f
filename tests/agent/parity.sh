#!/usr/bin/env bash
# torchrun parity and clear failures of lifeline-agent (issue 18): --version on every binary;
# OMP_NUM_THREADS=1 for several ranks when unset (said once), left alone when set; a command that
# fails before its first step the same way twice ends the job with the reason instead of spending
# the restart budget; a metrics port in use is named; a rank's last lines are not cut when the
# agent stops it.
set -euo pipefail
agent="$1"; cli="$2"; drill="$3"
dir="$(mktemp -d /tmp/lifeline-agent-parity-XXXXXX)"
trap 'rm -rf "$dir"; [ -n "${holder:-}" ] && kill "$holder" 2>/dev/null || true' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for b in "$agent" "$cli" "$drill" "$(dirname "$agent")/lifeline-sim"; do
  v="$("$b" --version)"
  echo "$v" | grep -Eq '^lifeline(-agent|-drill|-sim)? [0-9]+\.[0-9]+\.[0-9]+$' || fail "$b --version printed '$v'"
done

out="$(env -u OMP_NUM_THREADS "$agent" run --nproc 2 --max-restarts 0 -- sh -c 'echo "omp=$OMP_NUM_THREADS"' 2>&1)"
[ "$(echo "$out" | grep -c 'omp=1$')" = 2 ] || fail "OMP_NUM_THREADS not 1 on both ranks: $out"
[ "$(echo "$out" | grep -c 'OMP_NUM_THREADS=1 for each rank')" = 1 ] || fail "not said once: $out"
out="$(OMP_NUM_THREADS=3 "$agent" run --nproc 2 --max-restarts 0 -- sh -c 'echo "omp=$OMP_NUM_THREADS"' 2>&1)"
[ "$(echo "$out" | grep -c 'omp=3$')" = 2 ] || fail "a user's OMP_NUM_THREADS was overridden: $out"

events="$dir/events.jsonl"
set +e
out="$("$agent" run --nproc 2 --max-restarts 5 --events-log "$events" -- \
       sh -c 'echo "ModuleNotFoundError: No module named torchvisionx" >&2; exit 3' 2>&1)"
rc=$?
set -e
[ "$rc" = 1 ] || fail "exit status $rc for a command that always fails at start: $out"
launches="$(grep -c '"action":"launch"' "$events")"
[ "$launches" = 2 ] || fail "$launches launches for a command failing the same way at start (budget 5): $out"
grep -q 'failed before its first step the same way' "$events" || fail "no reason given: $(cat "$events")"
grep -q 'No module named torchvisionx' "$events" || fail "the reason does not quote the rank's last line"

# The port comes from the kernel, to the process that holds it: no window for another test to take it.
portfile="$(mktemp)"
python3 -c "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)" >"$portfile" &
holder=$!
for _ in $(seq 1 100); do [ -s "$portfile" ] && break; sleep 0.05; done
port="$(cat "$portfile")"
rm -f "$portfile"
[ -n "$port" ] || fail "the port holder did not start"
set +e
out="$("$agent" run --nproc 1 --metrics-addr "127.0.0.1:$port" -- true 2>&1)"
rc=$?
set -e
[ "$rc" = 2 ] || fail "exit status $rc with the metrics port in use: $out"
echo "$out" | grep -q "address 127.0.0.1:$port is in use" || fail "port in use not named: $out"

# Rank 1 dies while rank 0 is printing (as a traceback would be): all of rank 0's lines arrive.
set +e
out="$("$agent" run --nproc 2 --max-restarts 0 -- sh -c \
  'sleep 0.3; if [ "$RANK" = 1 ]; then exit 1; fi; i=0; while [ $i -lt 3000 ]; do i=$((i+1)); echo "line $i"; done; sleep 30' 2>&1)"
set -e
echo "$out" | grep -q '^\[rank 0\] line 3000$' || fail "rank 0's output was cut: $(echo "$out" | grep -c 'rank 0') lines"
echo OK
