#!/usr/bin/env bash
# Nothing outside the checkpoint root, ever, through the CLI: a step directory planted as a
# symbolic link (to a directory of other files, or to a complete step of another checkpoint) is
# listed as not complete, `lifeline gc --keep 1` removes only the link, and `lifeline verify`
# refuses a data file that is a link, naming it; FIFOs as a step's files hang no command.
set -euo pipefail
lifeline="$1"
source "$(dirname "$0")/common.sh" symlink

ckpt="$dir/D"
other="$dir/other"
victim="$dir/victim"
"$lifeline" bench save --dir "$ckpt" --ranks 1 --state-bytes 1MiB --hidden 64 --iterations 3 --keep-last 0 --no-baseline >/dev/null
"$lifeline" bench save --dir "$other" --ranks 1 --state-bytes 1MiB --hidden 64 --iterations 1 --keep-last 0 --no-baseline >/dev/null
mkdir -p "$victim/nested"
echo "do not delete" >"$victim/precious"
echo "nor this" >"$victim/nested/also"
other_step="$(ls -d "$other"/step-* | head -1)"
ln -s "$victim" "$ckpt/step-00000000000000000000"
ln -s "$other_step" "$ckpt/step-00000000000000000001"
snapshot() { (cd "$1" && find . -type f -exec sha256sum {} + | sort); }
victim_before="$(snapshot "$victim")"
other_before="$(snapshot "$other")"

ls_out="$("$lifeline" ls "$ckpt" --json)"
echo "$ls_out"
echo "$ls_out" | grep -q "symbolic link" || fail "ls does not say a step directory is a symbolic link"

"$lifeline" gc "$ckpt" --keep 1
[ "$(snapshot "$victim")" = "$victim_before" ] || fail "gc deleted files outside the checkpoint through a link"
[ "$(snapshot "$other")" = "$other_before" ] || fail "gc deleted another checkpoint's files through a link"
[ ! -e "$ckpt/step-00000000000000000000" ] && [ ! -L "$ckpt/step-00000000000000000000" ] || fail "gc kept the planted link"
[ ! -L "$ckpt/step-00000000000000000001" ] || fail "gc kept the planted link to another checkpoint"

# A data file replaced by a link to the same bytes elsewhere: verify refuses it, naming it.
data="$(ls "$ckpt"/step-*/*.data | head -1)"
mv "$data" "$dir/moved.data"
ln -s "$dir/moved.data" "$data"
if "$lifeline" verify "$ckpt" 2>"$dir/verify.err"; then
  fail "verify read a data file through a link"
fi
cat "$dir/verify.err"
grep -q "$(basename "$data")" "$dir/verify.err" || fail "verify did not name the linked file"
grep -q "symbolic link" "$dir/verify.err" || fail "verify did not say the file is a symbolic link"

# FIFOs planted as a step's manifest and index: ls, inspect, verify and gc answer at once (an
# open of a FIFO with no writer blocks forever), naming the file.
step="$(dirname "$data")"
for f in "$step"/*.manifest "$step"/*.index; do
  rm -f "$f"
  mkfifo "$f"
done
for command in "ls $ckpt" "inspect $ckpt" "verify $ckpt" "gc $ckpt --keep 1"; do
  # shellcheck disable=SC2086
  rc=0
  timeout 60 "$lifeline" $command >"$dir/fifo.out" 2>&1 || rc=$?
  [ "$rc" != 124 ] || fail "lifeline $command hung on a FIFO in the checkpoint"
done
"$lifeline" ls "$ckpt" 2>&1 | grep -q "not a regular file" || fail "ls does not say a file is not a regular file"
echo "cli_gc_symlink: ok"
