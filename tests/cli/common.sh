# Sourced by the CLI tests, after `lifeline="$1"`: $dir, a temporary directory of its own removed
# at exit (named after the test: $1 of `source common.sh NAME`), and fail.
set -euo pipefail
dir="$(mktemp -d "/tmp/lifeline-cli-$1-XXXXXX")"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
