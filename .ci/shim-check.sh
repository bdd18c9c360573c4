#!/usr/bin/env bash
# Only src/sync.rs may name std's atomics, threads, locks, spin hint and
# clock: everything else goes through the shim so loom sees it.
set -euo pipefail
cd "$(dirname "$0")/.."
pattern='std::sync::atomic|std::thread|std::sync::Mutex|parking_lot::|Instant::now|spin_loop|libc::'
# Test code (src/tests/, a module's own tests.rs, and modules after `mod
# tests`) may use real threads to set things up. Every folder of src/ is
# scanned.
hits=$(grep -rnE "$pattern" src --include=*.rs | grep -v "^src/sync.rs:" | grep -v "^src/tests/" | grep -v "/tests\.rs:" | grep -vE "^[^:]+:[0-9]+:\s*//" | while IFS=: read -r file line rest; do
  start=$(grep -n '^mod tests {' "$file" | head -1 | cut -d: -f1)
  if [ -z "$start" ] || [ "$line" -lt "$start" ]; then echo "$file:$line:$rest"; fi
done)
if [ -n "$hits" ]; then
  echo "shim check: these lines bypass src/sync.rs:" >&2
  echo "$hits" >&2
  exit 1
fi
echo "shim check: ok"
