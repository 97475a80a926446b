#!/usr/bin/env bash
# The Debian package end to end (a CI step; as root on Debian 12, where systemd is installed
# but need not run as PID 1):
#   1. build it: cpack -G DEB in the build directory (cmake/packaging.cmake)
#   2. lintian: any error (E:) fails; warnings and infos are printed
#   3. dpkg -i; systemd-analyze verify on the installed unit
#   4. tests/integration/test_deb.py on the installed package: files, conffile, unit, and
#      /usr/bin/kvpersist serving with /etc/kvpersist/kvpersist.yaml against the fake llama-server
#   5. dpkg -r keeps the conffile and nothing else; dpkg -P leaves no file of the package, no
#      /etc/kvpersist (key files an administrator put there included) and no enable symlinks
# Idempotent: a kvpersist package installed before is purged first, and it is purged on exit.
# Env: KVP_BUILD_DIR (default: build, the directory scripts/test.sh builds).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "package-test: FAIL: $*" >&2; exit 1; }
say() { printf '\n---- package-test: %s\n' "$*"; }

[[ $(id -u) == 0 ]] || fail "needs root (dpkg -i / -P)"
for tool in cpack lintian dpkg-shlibdeps systemd-analyze; do
  command -v "$tool" >/dev/null || fail "$tool is missing: run scripts/setup.sh"
done

# dpkg does not wait for its lock (apt-get does, with DPkg::Lock::Timeout): retry, for up to
# 10 minutes, while another package operation (a concurrent apt-get, an unattended upgrade)
# holds it.
dpkg_wait() {
  local out try
  for ((try = 0; try < 300; try++)); do
    if out=$(dpkg "$@" 2>&1); then
      printf '%s\n' "$out"
      return 0
    fi
    if ! grep -q "locked by another process" <<<"$out"; then
      printf '%s\n' "$out" >&2
      return 1
    fi
    sleep 2
  done
  fail "dpkg $*: the dpkg lock stayed taken for 10 minutes"
}

purge() {
  if dpkg-query -W -f='${db:Status-Abbrev}' kvpersist 2>/dev/null | grep -q '^[ir][ic]'; then
    dpkg_wait -P kvpersist >/dev/null
  fi
}
trap purge EXIT
purge

build=${KVP_BUILD_DIR:-build}
say "build ($build)"
# KVP_WERROR only when set (CI sets it): a flip would rebuild everything
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${KVP_WERROR:+-DKVP_WERROR="$KVP_WERROR"} >/dev/null
ninja -C "$build" kvpersist kvp_packaging_docs
rm -f "$build"/kvpersist_*.deb
(cd "$build" && cpack -G DEB >/dev/null)
debs=("$build"/kvpersist_*_amd64.deb)
[[ ${#debs[@]} == 1 && -f ${debs[0]} ]] || fail "cpack made ${debs[*]}, not one kvpersist_<version>_amd64.deb"
deb=${debs[0]}
dpkg-deb --info "$deb" | sed -n '/Package:/,$p'
dpkg-deb --contents "$deb"

say "lintian $deb"
# --fail-on error: exit non-zero on any E: tag; warnings and infos are printed, not fatal.
lintian --fail-on error --display-info "$deb" || fail "lintian reports errors (E: above)"

say "dpkg -i"
dpkg_wait -i "$deb"
unit=/lib/systemd/system/kvpersist.service

say "systemd-analyze verify $unit"
# Without systemd as PID 1 verify still loads the unit and checks every directive and the
# ExecStart binary; it prints nothing when all is well.
out=$(systemd-analyze verify --man=no "$unit" 2>&1) || fail "systemd-analyze verify: $out"
[[ -z $out ]] || fail "systemd-analyze verify warns: $out"

say "the installed binary against the fake llama-server (tests/integration/test_deb.py)"
KVP_DEB_TEST=1 KVPERSIST_BIN=/usr/bin/kvpersist \
  /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/integration/test_deb.py

say "dpkg -r: the conffile stays, nothing else"
mapfile -t files < <(dpkg -L kvpersist)
conffile=/etc/kvpersist/kvpersist.yaml
dpkg_wait -r kvpersist
[[ $(dpkg-query -W -f='${db:Status-Abbrev}' kvpersist) == "rc "* ]] || fail "not in config-files state after dpkg -r"
[[ -f $conffile ]] || fail "dpkg -r removed the conffile $conffile"
for f in "${files[@]}"; do
  [[ $f == "$conffile" || -d $f || ! -e $f ]] || fail "dpkg -r left $f"
done

say "dpkg -P: nothing of the package is left, the key files included"
# an administrator's secrets for the unit's LoadCredential= (README "systemd")
(umask 077; echo package-test-key > /etc/kvpersist/upstream-api-key; echo token > /etc/kvpersist/admin-token)
dpkg_wait -P kvpersist
! dpkg-query -W kvpersist >/dev/null 2>&1 || fail "dpkg still knows kvpersist after dpkg -P"
for f in "${files[@]}"; do
  # directories shared with other packages (/usr/bin, /etc, ...) stay; ours go
  if [[ -e $f || -L $f ]] && ! { [[ -d $f ]] && dpkg-query -S "$f" >/dev/null 2>&1; }; then
    fail "dpkg -P left $f"
  fi
done
for f in /etc/kvpersist /etc/systemd/system/multi-user.target.wants/kvpersist.service \
         /etc/systemd/system/kvpersist.service /var/lib/systemd/deb-systemd-helper-enabled/kvpersist.service.dsh-also \
         /var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/kvpersist.service \
         /var/lib/systemd/deb-systemd-helper-masked/kvpersist.service; do
  [[ ! -e $f && ! -L $f ]] || fail "dpkg -P left $f"
done
say "ok: $(basename "$deb") built, lintian-clean of errors, installed, ran, removed and purged"
