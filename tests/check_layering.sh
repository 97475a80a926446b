#!/usr/bin/env bash
# core/ is sans-I/O: no Asio, Beast, yaml-cpp or sockets. config/ sees yaml-cpp only in
# load_yaml.cpp; proxy/'s planes depend one way. Debian puts Boost in /usr/include, so CMake alone cannot enforce this.
set -euo pipefail
root=${1:-.}
fail=0
if grep -rnE '#include *[<"](boost/(asio|beast)|yaml-cpp|sys/socket|netinet|arpa/)' "$root/core"; then
  echo "layering: core/ must not include I/O libraries (see docs/conventions.md §1)" >&2
  fail=1
fi
if grep -rlE '#include *[<"]yaml-cpp' "$root/config" | grep -v 'load_yaml.cpp$'; then
  echo "layering: only config/load_yaml.cpp may include yaml-cpp" >&2
  fail=1
fi
if grep -rnE '#include *"proxy/' "$root/core" "$root/backends" "$root/config"; then
  echo "layering: core/, backends/ and config/ must not depend on proxy/" >&2
  fail=1
fi
# proxy/'s planes (docs/architecture.md, "Layers"): http <- control <- {admin, data} <- tools.
# A plane includes only the planes left of it: admin and data are siblings, neither includes
# the other; tools (the composition root, proxy/tools/daemon.hpp) joins them.
check_plane() {  # plane, the planes it must not include
  local plane=$1 forbidden=$2
  if grep -rnE "#include *\"proxy/($forbidden)/" "$root/proxy/$plane"; then
    echo "layering: proxy/$plane/ must not depend on proxy/{${forbidden//|/,}}/" >&2
    fail=1
  fi
}
check_plane http 'control|admin|data|tools'
check_plane control 'admin|data|tools'
check_plane admin 'data|tools'
check_plane data 'admin|tools'
if grep -rnE '/slots' "$root/core" "$root/proxy" --include='*.cpp' --include='*.hpp' | grep -v 'classify_target\|starts_with("/slots/")\|path == "/slots"\|/slots\* \|/slots is not forwarded\|//'; then
  echo "layering: only backends/ may know a /slots URL" >&2
  fail=1
fi
# docs/conventions.md §2: an error's status is chosen in one place, the table in
# proxy/http/http_status.cpp; elsewhere a status is only a success (200, 204, 100 Continue).
if grep -rnoE 'http::status::[a-z_]+|static_cast<http::status>|http::status\{|refused\(http' \
      "$root/proxy" "$root/backends" --include='*.cpp' --include='*.hpp' \
    | grep -v '/proxy/http/http_status\.cpp:' | grep -vE ':http::status::(ok|no_content|continue_)$'; then
  echo "layering: only proxy/http/http_status.cpp chooses an error's status: give the error its errc" >&2
  fail=1
fi
# Python (docs/conventions.md §5): helpers live in tests/kvptest/, tests/integration/ holds test
# modules and conftest.py only, and no import of our own code edits sys.path (make-test-model.py
# loads gguf-py from the llama.cpp tree its --llama-src names).
if ls "$root"/tests/integration/*.py | grep -vE '/(test_[a-z0-9_]+|conftest)\.py$'; then
  echo "layering: tests/integration/ holds only test_*.py and conftest.py; helpers go to tests/kvptest/" >&2
  fail=1
fi
if grep -rnE 'sys\.path\.(insert|append)' "$root/tests" "$root/bench" "$root/scripts" --include='*.py' \
    | grep -v '/scripts/make-test-model\.py:'; then
  echo "layering: no sys.path edits: tests/integration/pytest.ini's pythonpath, PYTHONPATH=<repo>/tests in scripts" >&2
  fail=1
fi
((fail == 0)) && echo "layering: ok"
exit $fail
