#!/usr/bin/env bash
# Retention and listing through the CLI, as an operator uses them (issue 17, findings 4 and 7):
# with one flipped byte in the newest step's data, `lifeline gc --keep 1` keeps the older good step
# (a step counts toward --keep only once it verifies), and a step whose rank index does not decode
# is listed as damaged, never complete.
set -euo pipefail
lifeline="$1"
source "$(dirname "$0")/common.sh" retention
state_of() { "$lifeline" ls "$1" --json | python3 -c "import json,sys; print({c['step']: c['state'] for c in json.load(sys.stdin)['checkpoints']}.get($2, 'absent'))"; }

ckpt="$dir/D"
"$lifeline" bench save --dir "$ckpt" --ranks 2 --state-bytes 2MiB --hidden 64 --step 1 --iterations 2 --keep-last 0 --no-baseline >/dev/null
step2="$ckpt/step-00000000000000000002"
[ "$(state_of "$ckpt" 2)" = complete ] || fail "step 2 not complete after the save"

# One flipped byte in the middle of step 2's first data file (a chunk, not the header).
data="$(ls "$step2"/*.data | head -1)"
python3 - "$data" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(4096 + 100)
    b = f.read(1)
    f.seek(4096 + 100)
    f.write(bytes([b[0] ^ 0x01]))
PY
if "$lifeline" verify "$ckpt" --step 2 >/dev/null 2>&1; then fail "verify accepted the flipped byte"; fi
dry="$("$lifeline" gc "$ckpt" --keep 1 --dry-run)"
echo "$dry"
echo "$dry" | grep -q "would remove step 1" && fail "gc --dry-run would remove the only good step"
"$lifeline" gc "$ckpt" --keep 1
[ "$(state_of "$ckpt" 1)" = complete ] || fail "gc --keep 1 removed step 1, the only step that verifies"
"$lifeline" verify "$ckpt" --step 1 >/dev/null || fail "step 1 does not verify after gc"

# A rank index that does not decode: ls says damaged, not complete.
"$lifeline" bench save --dir "$ckpt" --ranks 2 --state-bytes 2MiB --hidden 64 --step 3 --iterations 1 --keep-last 0 --no-baseline >/dev/null
index="$(ls "$ckpt"/step-00000000000000000003/*.index | head -1)"
python3 - "$index" <<'PY'
import sys
with open(sys.argv[1], "r+b") as f:
    data = bytearray(f.read())
    data[len(data) // 2] ^= 0x20
    f.seek(0)
    f.write(data)
PY
rm -f "$ckpt"/step-00000000000000000003/*.manifest
[ "$(state_of "$ckpt" 3)" = damaged ] || fail "ls calls step 3 '$(state_of "$ckpt" 3)' with an index that does not decode"
"$lifeline" ls "$ckpt" | grep -E "^3 .*damaged" >/dev/null || fail "the table does not say damaged"
echo "OK"
