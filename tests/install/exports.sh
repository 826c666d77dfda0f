#!/usr/bin/env bash
# liblifeline.so exports the public API and nothing of the library's insides: every exported
# symbol is the C API (lifeline_*) or in namespace lifeline:: (with its type information), and no
# exported symbol names a class or namespace declared only in the private headers (lib/src,
# formats, lifeline/internal/).
# Usage: exports.sh LIBLIFELINE_SO SOURCE_ROOT
set -euo pipefail
lib=$1
root=$2
symbols=$(nm -DC --defined-only "$lib" | awk '{ $1 = ""; $2 = ""; sub(/^  /, ""); print }')
[ -n "$symbols" ] || { echo "FAIL: $lib exports nothing"; exit 1; }
echo "$lib: $(echo "$symbols" | wc -l) exported symbols"

fail=0
foreign=$(echo "$symbols" | grep -Ev '^(lifeline_[a-z0-9_]+|lifeline::.*|(typeinfo|typeinfo name|vtable) for lifeline::.*)$' || true)
if [ -n "$foreign" ]; then
  echo "FAIL: exported symbols outside the public API:"; echo "$foreign" | head -20; fail=1
fi
# Namespaces that are internal by name.
inner=$(echo "$symbols" | grep -E 'lifeline::(format|internal|agent|cli|test|trace::internal)::|anonymous namespace' || true)
if [ -n "$inner" ]; then
  echo "FAIL: exported symbols of internal namespaces:"; echo "$inner" | head -20; fail=1
fi
# Classes declared in private headers and not in public ones.
types() { grep -hoE '^ *(class|struct) [A-Za-z_][A-Za-z0-9_]* *(final)? *(:[^{;]*)?\{' "$@" 2>/dev/null |
          sed -E 's/^ *(class|struct) ([A-Za-z0-9_]+).*/\2/' | sort -u; }
public=$(types "$root"/lib/include/lifeline/*.h)
private=$(types $(find "$root/lib/src" "$root/formats" "$root/lib/include/lifeline/internal" -name '*.h'))
internal_only=$(comm -23 <(echo "$private") <(echo "$public"))
for t in $internal_only; do
  hit=$(echo "$symbols" | grep -E "(^|[^A-Za-z0-9_:])lifeline::$t(::|[^A-Za-z0-9_]|$)" | head -3 || true)
  if [ -n "$hit" ]; then
    echo "FAIL: internal class $t is exported:"; echo "$hit"; fail=1
  fi
done
echo "checked against $(echo "$internal_only" | wc -w) internal classes"
[ $fail -eq 0 ] && echo "OK: only the public API is exported"
exit $fail
