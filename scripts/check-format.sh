#!/usr/bin/env bash
# Fails if any C++ file differs from .clang-format.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cpp')
if [ ${#files[@]} -eq 0 ]; then exit 0; fi
bad=0
for f in "${files[@]}"; do
  if ! clang-format --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "format: $f differs from .clang-format (run: clang-format -i $f)"
    bad=1
  fi
done
if [ $bad -ne 0 ]; then exit 1; fi
echo "format: ${#files[@]} files clean"
