#!/usr/bin/env bash
# Run the whole test suite as root: installs what is missing first (./install.sh is idempotent).
# Tests that build labs use their own state directory and lab names starting with "lt".
#   ./test.sh [PYTEST ARGS]   the suite on this machine's kernel
#   ./test.sh --vm [--smoke]  the VM tier: labctl in a Vagrant VM on Debian's stock kernel (vm/test-vm.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = "--vm" ]; then
  shift
  exec "$here/vm/test-vm.sh" "$@"
fi
"$here/install.sh"
cd "$here"
exec "$here/.venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@"
