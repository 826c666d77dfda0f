#!/usr/bin/env bash
# `lifeline ls` says which steps the agents replicated to peer nodes' memory (issue 21), from the
# records they keep in DIR/.replicas: "yes" when every rank's snapshot of a step is on a peer, "k/W"
# when only some are. The records are written here as an agent writes them (one per node's ranks);
# a malformed one, or one linked in from elsewhere, counts nothing, and neither gc nor verify is
# upset by the directory.
set -euo pipefail
lifeline="$1"
source "$(dirname "$0")/common.sh" replicated

ckpt="$dir/D"
"$lifeline" bench save --dir "$ckpt" --ranks 2 --state-bytes 1MiB --hidden 64 --step 1 --iterations 3 --keep-last 0 --no-baseline >/dev/null
record() {  # record FIRST RANKS STEPS...: the record of ranks FIRST..FIRST+RANKS-1 of a world of 2
  local first="$1" ranks="$2"; shift 2
  local steps; steps="$(IFS=,; echo "$*")"
  printf '{"format": "lifeline-replication-1", "world_size": 2, "first_rank": %d, "ranks": %d, "node": "node-%d", "peers": ["node-x"], "steps": [%s], "updated_unix_ms": 1700000000000}\n' \
    "$first" "$ranks" "$first" "$steps" >"$ckpt/.replicas/ranks-$first-$((first + ranks - 1))-of-2.json"
}
mkdir -p "$ckpt/.replicas"
record 0 1 3 2   # node 0's rank: steps 3 and 2 on a peer
record 1 1 3     # node 1's rank: step 3 only
# Torn: would claim step 1 for both ranks, counts nothing.
echo '{"format": "lifeline-replication-1", "world_size": 2, "first_rank": 0, "ranks": 2, "steps": [1' >"$ckpt/.replicas/ranks-0-1-of-2.json"

table="$("$lifeline" ls "$ckpt")"
echo "$table"
echo "$table" | head -1 | grep -Eq "^STEP +STATE +WHERE +REPLICA +RANKS" || fail "no REPLICA column"
echo "$table" | grep -Eq "^3 +complete +disk +yes +2 " || fail "step 3 is not shown replicated"
echo "$table" | grep -Eq "^2 +complete +disk +1/2 +2 " || fail "step 2 is not shown with 1 of 2 ranks replicated"
echo "$table" | grep -Eq "^1 +complete +disk +- +2 " || fail "step 1 is shown replicated"

json="$("$lifeline" ls "$ckpt" --json)"
python3 - "$json" <<'PY' || fail "ls --json does not say what is replicated"
import json, sys
rows = {c["step"]: (c["replicated"], c["replicated_ranks"]) for c in json.loads(sys.argv[1])["checkpoints"]}
assert rows == {3: (True, 2), 2: (False, 1), 1: (False, 0)}, rows
PY

# The same record, well formed but outside the checkpoint directory and linked in: not followed.
echo '{"format": "lifeline-replication-1", "world_size": 2, "first_rank": 0, "ranks": 2, "node": "n", "peers": [], "steps": [1], "updated_unix_ms": 1}' >"$dir/elsewhere.json"
ln -sf "$dir/elsewhere.json" "$ckpt/.replicas/ranks-0-1-of-2.json"
"$lifeline" ls "$ckpt" | grep -Eq "^1 +complete +disk +- +2 " || fail "a record linked in from elsewhere was followed"

"$lifeline" verify "$ckpt" >/dev/null || fail "verify is upset by .replicas"
"$lifeline" gc "$ckpt" --keep 1 >/dev/null || fail "gc is upset by .replicas"
[ -f "$ckpt/.replicas/ranks-0-0-of-2.json" ] || fail "gc removed the agents' records"
[ -f "$dir/elsewhere.json" ] || fail "a link in .replicas was followed and its target removed"
"$lifeline" ls "$ckpt" | grep -Eq "^3 +complete +disk +yes " || fail "step 3 no longer shown replicated after gc"
echo "cli_ls_replicated: ok"
