#!/usr/bin/env bash
# End to end through the CLI: a 4-rank TP=2 x DP=2 save loads into other world sizes and layouts
# with 0 mismatches; verify accepts it, and exits 1 naming the file once any byte of it is damaged:
# a data chunk, a rank index (with the manifest present), the manifest (which a load bypasses),
# a data-file header past its checksummed fields, or the data file's length. A compressed save
# takes its compressed size on disk.
set -euo pipefail
lifeline="$1"
work="$(mktemp -d /tmp/lifeline-cli-XXXXXX)"
trap 'rm -rf "$work"' EXIT
dir="$work/ckpt"

mismatches() { sed -n 's/.*"mismatches": *\([0-9]*\).*/\1/p'; }

# Adds 1 to the byte at offset $2 of file $1.
flip() {
  local orig
  orig=$(dd if="$1" bs=1 skip="$2" count=1 2>/dev/null | od -An -tu1 | tr -d ' ')
  printf "$(printf '\\%03o' $(( (orig + 1) % 256 )))" | dd of="$1" bs=1 seek="$2" count=1 conv=notrunc 2>/dev/null
}

# verify must exit 1 and name $1 (a file name) in its error; $2 says what was damaged.
expect_damaged() {
  local rc=0
  "$lifeline" verify "$dir" 2>"$work/verify.err" || rc=$?
  cat "$work/verify.err"
  [ "$rc" = 1 ] || { echo "FAIL: verify exited $rc after $2 (want 1)"; exit 1; }
  grep -q "$1" "$work/verify.err" || { echo "FAIL: verify did not name $1 after $2"; exit 1; }
}

restore() { rm -rf "$dir"; cp -a "$work/pristine" "$dir"; }

"$lifeline" bench save --dir "$dir" --ranks 4 --tp 2 --dp 2 --state-bytes 24MiB --hidden 128 --step 5 --no-baseline --json
for layout in "3 3 1" "5 5 1" "6 2 3" "1 1 1" "6 3 2"; do
  set -- $layout
  out="$("$lifeline" bench load --dir "$dir" --ranks "$1" --tp "$2" --dp "$3" --json)"
  echo "$out"
  [ "$(echo "$out" | mismatches)" = "0" ] || { echo "FAIL: load into ranks=$1 tp=$2 dp=$3 has mismatches"; exit 1; }
done
"$lifeline" verify "$dir"
cp -a "$dir" "$work/pristine"
step_dir="$(ls -d "$dir"/step-* | tail -n 1)"

# Flip one byte in the middle of rank 1's data file (past the 4096-byte header).
data="$(ls "$step_dir"/*.r000001-of-000004.data)"
size=$(stat -c %s "$data")
flip "$data" $(( 4096 + (size - 4096) / 2 ))
expect_damaged "$(basename "$data")" "a flipped chunk byte"
grep -q "checksum mismatch" "$work/verify.err" || { echo "FAIL: verify did not report a checksum mismatch"; exit 1; }
grep -q "tensor '" "$work/verify.err" || { echo "FAIL: verify did not name the tensor"; exit 1; }

# A rank index the manifest lets a load skip: verify reads it anyway.
restore
ls "$step_dir"/*.manifest >/dev/null
index="$(ls "$step_dir"/*.r000002-of-000004.index)"
flip "$index" $(( $(stat -c %s "$index") / 2 ))
expect_damaged "$(basename "$index")" "a flipped rank-index byte"

# A damaged manifest: loads fall back to the rank indexes, verify fails.
restore
manifest="$(ls "$step_dir"/*.manifest)"
flip "$manifest" $(( $(stat -c %s "$manifest") / 2 ))
out="$("$lifeline" bench load --dir "$dir" --ranks 2 --tp 2 --dp 1 --json)"
[ "$(echo "$out" | mismatches)" = "0" ] || { echo "FAIL: load with a damaged manifest has mismatches"; exit 1; }
expect_damaged "$(basename "$manifest")" "a flipped manifest byte"

# A data-file header byte after its checksummed fields.
restore
data0="$(ls "$step_dir"/*.r000000-of-000004.data)"
flip "$data0" 100
expect_damaged "$(basename "$data0")" "a flipped header byte at offset 100"

# Bytes appended to a data file.
restore
head -c 4096 /dev/zero >>"$data0"
expect_damaged "$(basename "$data0")" "4096 bytes appended to a data file"

restore
"$lifeline" verify "$dir"

# Compression saves disk space: the data file holds the compressed bytes, nothing more.
z="$work/compressed"
"$lifeline" bench save --dir "$z" --ranks 1 --state-bytes 64MiB --codec zstd-bytegroup --iterations 1 --no-baseline --json
zdata="$(ls "$z"/step-*/*.data)"
allocated=$(( $(stat -c '%b * %B' "$zdata") ))
echo "64 MiB state: data file $(stat -c %s "$zdata") bytes long, $allocated bytes on disk; du: $(du -sk "$z" | cut -f1) KiB"
[ "$allocated" -lt $(( 32 << 20 )) ] || { echo "FAIL: a compressed 64 MiB state takes $allocated bytes on disk"; exit 1; }
"$lifeline" verify "$z"
echo "cli_reshard_verify: ok"
