#!/usr/bin/env bash
# Installs what kvpersist needs to build and test on Debian 12, idempotently.
# Usage: scripts/setup.sh            (as root, or with sudo available)
# Env:   KVP_SKIP_APT=1              skip apt-get (dependencies already present)
set -euo pipefail

pkgs=(
  build-essential cmake ninja-build pkg-config git ca-certificates curl ccache
  libboost1.81-dev rapidjson-dev libfmt-dev libyaml-cpp-dev catch2 libssl-dev libsystemd-dev
  libxxhash-dev universal-ctags
  python3 python3-numpy python3-pytest python3-pytest-xdist python3-requests python3-yaml nodejs npm
  systemd strace dpkg-dev lintian
  nginx-light wrk gnuplot-nox valgrind
  chromium
  clang libclang-rt-14-dev
)

if [[ "${KVP_SKIP_APT:-0}" == 1 ]]; then exit 0; fi

missing=()
for p in "${pkgs[@]}"; do
  # nodejs/npm may come from elsewhere (nvm, NodeSource); accept any working binary.
  if [[ $p == nodejs ]] && command -v node >/dev/null; then continue; fi
  if [[ $p == npm ]] && command -v npm >/dev/null; then continue; fi
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all build and test dependencies are installed" >&2
  exit 0
fi

sudo=()
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: run as root or install sudo; missing: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
