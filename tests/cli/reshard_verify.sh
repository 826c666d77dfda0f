#!/usr/bin/env bash
# End to end through the CLI: a 4-rank TP=2 x DP=2 save loads into other world sizes and layouts
# with 0 mismatches; verify accepts it, and rejects it once one byte of a data chunk is flipped.
set -euo pipefail
lifeline="$1"
dir="$(mktemp -d /tmp/lifeline-cli-XXXXXX)"
trap 'rm -rf "$dir"' EXIT

mismatches() { sed -n 's/.*"mismatches": *\([0-9]*\).*/\1/p'; }

"$lifeline" bench save --dir "$dir" --ranks 4 --tp 2 --dp 2 --state-bytes 24MiB --hidden 128 --step 5 --no-baseline --json
for layout in "3 3 1" "5 5 1" "6 2 3" "1 1 1" "6 3 2"; do
  set -- $layout
  out="$("$lifeline" bench load --dir "$dir" --ranks "$1" --tp "$2" --dp "$3" --json)"
  echo "$out"
  [ "$(echo "$out" | mismatches)" = "0" ] || { echo "FAIL: load into ranks=$1 tp=$2 dp=$3 has mismatches"; exit 1; }
done
"$lifeline" verify "$dir"

# Flip one byte in the middle of rank 1's data file (past the 4096-byte header).
data="$(ls "$dir"/step-*/*.r000001-of-000004.data)"
size=$(stat -c %s "$data")
offset=$(( 4096 + (size - 4096) / 2 ))
orig=$(dd if="$data" bs=1 skip="$offset" count=1 2>/dev/null | od -An -tu1 | tr -d ' ')
printf "$(printf '\\%03o' $(( (orig + 1) % 256 )))" | dd of="$data" bs=1 seek="$offset" count=1 conv=notrunc 2>/dev/null
if "$lifeline" verify "$dir" 2>"$dir/verify.err"; then
  echo "FAIL: verify accepted a flipped byte"; exit 1
fi
cat "$dir/verify.err"
grep -q "checksum mismatch" "$dir/verify.err" || { echo "FAIL: verify did not report a checksum mismatch"; exit 1; }
grep -q "$(basename "$data")" "$dir/verify.err" || { echo "FAIL: verify did not name the file"; exit 1; }
grep -q "tensor '" "$dir/verify.err" || { echo "FAIL: verify did not name the tensor"; exit 1; }
echo "cli_reshard_verify: ok"
