#!/usr/bin/env bash
# Sizes the code may not outgrow (docs/conventions.md §6), read from universal-ctags' tags
# (line and end of every definition):
#  (a) a function in proxy/ spans at most 80 lines, from the line of its name to its closing
#      brace; lambdas count in the function around them. Excepted: relay_response
#      (proxy/http/relay.hpp), Beast's relay recipe kept in one piece (docs/conventions.md §4).
#  (b) a class or struct in core/ or proxy/ has at most 30 member functions. Counted: every
#      member function declared or defined inside the class body (constructors, destructor,
#      operators, `= default`/`= delete` included; a nested class's members count for the
#      nested class), each distinct name + parameter list once. Not counted: definitions
#      outside the body (they repeat a declaration), lambdas, data members, friends' bodies.
# Usage: tests/check_sizes.sh [ROOT]      (needs universal-ctags: scripts/setup.sh installs it)
set -euo pipefail
root=${1:-.}
cd "$root"
if ! ctags --version 2>/dev/null | grep -q 'Universal Ctags'; then
  echo "sizes: needs universal-ctags (apt-get install universal-ctags, or scripts/setup.sh)" >&2
  exit 1
fi
max_lines=80
max_members=30
fail=0
tags() {  # file, kind, line, end, scope kind, scope, name, signature: one definition a line
  ctags -R -x --languages=C++ --kinds-C++=cfps --fields=+neKZS \
    --_xformat='%{input}	%{kind}	%{line}	%{end}	%{scopeKind}	%{scope}	%{name}	%{signature}' "$@"
}

long=$(tags proxy | awk -F'\t' -v max="$max_lines" '
  $2 == "function" && $7 !~ /^__anon/ && !($7 == "relay_response" && $1 == "proxy/http/relay.hpp") {
    n = $4 - $3 + 1
    if (n > max) printf "%s:%s: %s%s is %d lines (at most %d)\n", $1, $3, ($6 == "" ? "" : $6 "::"), $7, n, max
  }')
if [[ -n $long ]]; then
  echo "$long" >&2
  echo "sizes: a function in proxy/ fits in $max_lines lines (docs/conventions.md §6)" >&2
  fail=1
fi

wide=$(tags core proxy | awk -F'\t' -v max="$max_members" '
  ($2 == "class" || $2 == "struct") {
    full = ($6 == "" ? $7 : $6 "::" $7)
    body[full, $1] = $3 " " $4
    where[full] = $1 ":" $3
    next
  }
  ($2 == "function" || $2 == "prototype") && ($5 == "class" || $5 == "struct") && $7 !~ /^__anon/ {
    fn[++nfn] = $0
  }
  END {
    for (i = 1; i <= nfn; ++i) {
      split(fn[i], f, "\t")
      if (!((f[6], f[1]) in body)) continue
      split(body[f[6], f[1]], range, " ")
      if (f[3] + 0 < range[1] + 0 || f[3] + 0 > range[2] + 0) continue  # defined outside the body
      sig = f[8]
      gsub(/ /, "", sig)
      key = f[6] SUBSEP f[7] sig
      if (key in seen) continue
      seen[key] = 1
      count[f[6]]++
    }
    for (c in count)
      if (count[c] > max) printf "%s: %s has %d member functions (at most %d)\n", where[c], c, count[c], max
  }' | sort)
if [[ -n $wide ]]; then
  echo "$wide" >&2
  echo "sizes: a class has at most $max_members member functions (docs/conventions.md §6)" >&2
  fail=1
fi
((fail == 0)) && echo "sizes: ok"
exit $fail
