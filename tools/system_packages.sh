#!/usr/bin/env bash
# The Debian packages the kit needs beyond Python, installed where this machine allows:
#   libaio-dev  DeepSpeed's async_io op (NVMe offload, ZeRO-Infinity) links against it
#   chromium    the browser test of notebook 03's form (tests/test_browser_form.py)
#   libtcmalloc-minimal4  the memory allocator of launched CPU ranks (helpers/launch.py: a
#               quarter faster); without it they use glibc's
# Debian and Ubuntu (Colab too): as root with apt-get the missing ones are installed; otherwise the one
# command that installs them is printed and setup goes on: the tutorial then runs everything that
# does not need them and says what it left out.
#   bash tools/system_packages.sh            install or advise; always exits 0
#   bash tools/system_packages.sh --strict   the same, then exits 1 if any is still missing (CI)
set -uo pipefail

missing() {
  local out=""
  dpkg -s libaio-dev >/dev/null 2>&1 || out="$out libaio-dev"
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
    || out="$out chromium"
  # ldconfig's list, as ctypes finds the library (ldconfig is in /sbin, off a user's PATH)
  case "$({ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null)" in
    *libtcmalloc_minimal.so*) ;;
    *) out="$out libtcmalloc-minimal4" ;;
  esac
  echo "$out"
}

need="$(missing)"
if [ -n "$need" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing the system packages the kit needs:$need"
    log="${TMPDIR:-/tmp}/zero-kit-apt.log"
    apt-get update -qq >"$log" 2>&1
    for package in $need; do  # one at a time: a package this release lacks stops no other
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >>"$log" 2>&1 \
        || { echo "setup: apt-get could not install $package (log: $log)"; tail -3 "$log"; }
    done
  else
    echo "setup: missing system packages:$need. Install them with:"
    echo "    sudo apt-get install -y$need"
    echo "setup: going on without them (without libaio-dev NVMe offload rows are reported as" \
         "not run; without chromium the browser test cannot run; without libtcmalloc-minimal4" \
         "launched CPU ranks run slower)"
  fi
  need="$(missing)"
fi
if [ "${1:-}" = "--strict" ] && [ -n "$need" ]; then
  echo "setup: still missing:$need (under CI: NVMe offload, the browser test, fast CPU ranks)" >&2
  exit 1
fi
exit 0
