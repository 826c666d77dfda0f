# Sourced by tools/setup and tools/fuzz: what differs between the Debian releases Lifeline is built
# on (12 bookworm, 13 trixie), and installing missing packages.

# The release's major version (12, 13, ...) from /etc/os-release.
debian_release() {
  local id version
  id=$(. /etc/os-release && echo "${ID:-}")
  version=$(. /etc/os-release && echo "${VERSION_ID:-}")
  if [ "$id" != debian ] || [ -z "$version" ]; then
    echo "setup: this is not Debian (/etc/os-release: ID=$id VERSION_ID=$version); Lifeline's tools" \
         "install Debian 12 or 13 packages" >&2
    return 1
  fi
  echo "${version%%.*}"
}

# The clang whose packages carry libFuzzer and the sanitizer runtimes on this release.
debian_clang_version() {
  case "$(debian_release)" in
    12) echo 14 ;;
    13) echo 19 ;;
    *) echo "setup: no clang with libFuzzer chosen for Debian $(debian_release) (12: clang-14, 13: clang-19)" >&2
       return 1 ;;
  esac
}

# Installs those of the named Debian packages that are not installed yet (apt-get update once).
debian_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "setup: installing Debian packages: ${missing[*]}"
  local sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
