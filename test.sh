#!/usr/bin/env bash
# Run the whole test suite as root: installs what is missing first (./install.sh is idempotent).
# Tests that build labs use their own state directory and lab names starting with "lt".
#   ./test.sh [PYTEST ARGS]   the suite on this machine's kernel (LABCTL_TEST_WORKERS=1: one worker)
#   LABCTL_TEST_PART=parallel|solo ./test.sh   one of its two parts (below); .ci/run runs the parallel
#                             part, then the solo part with the VM smoke tier beside it in an idle CPU cgroup
#   ./test.sh --vm [--smoke]  the VM tier: labctl in a Vagrant VM on Debian's stock kernel (vm/test-vm.sh)
#   LABCTL_FORWARDING=slow ./test.sh   the suite with every router on the IP stack (the slow path);
#                             tests/test_netns_fastpath.py holds the two paths to one another in every run
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = "--vm" ]; then
  shift
  exec "$here/vm/test-vm.sh" "$@"
fi
part=${LABCTL_TEST_PART:-both}
case "$part" in both|parallel|solo) ;; *) echo "test.sh: LABCTL_TEST_PART is parallel, solo or unset (both), not '$part'" >&2; exit 2 ;; esac
"$here/install.sh"
cd "$here"
# Two parts. First every test without the solo mark, on two workers (pytest-xdist; tests/conftest.py
# keeps a module, and modules sharing the Docker engine or Mininet, on one worker). Then the solo
# tests, one at a time: their PFC and ECN react from a user-space controller that a second worker's
# lab slows past its headroom. Exit status 5 is pytest's "nothing selected" (e.g. -k picked only one part).
pytest=("$here/.venv/bin/python" -m pytest -q -p no:cacheprovider)
status=5 solo=5
if [ "$part" != solo ]; then
  status=0
  "${pytest[@]}" -n "${LABCTL_TEST_WORKERS:-2}" -m "not solo" tests "$@" || status=$?
fi
if [ "$part" != parallel ]; then
  solo=0
  # the fifteen slowest, so that a CI log says where the solo part's time went
  "${pytest[@]}" -m solo --durations=15 tests "$@" || solo=$?
fi
if [ "$status" -eq 5 ] && [ "$solo" -eq 5 ]; then exit 5; fi
[ "$status" -eq 5 ] && status=0
[ "$solo" -eq 5 ] && solo=0
[ "$status" -ne 0 ] && exit "$status"
exit "$solo"
