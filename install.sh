#!/usr/bin/env bash
# Install labctl and everything it needs on Debian 12 / Ubuntu 24.04, as root. Safe to run again.
#   ./install.sh          install: system packages, a virtualenv in .venv, /usr/local/bin/labctl
#   ./install.sh --demo   install, then build the bundled leaf-spine lab, ping across it, show it,
#                         run a ring all-reduce on it, and take it down again
#   ./install.sh --system-packages   only the system packages (CI installs them before the VM tier)
# The Vagrantfile provisions with this script; CI runs it too (.ci/run → test.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
demo=0 system_only=0
for arg in "$@"; do
  case "$arg" in
    --demo) demo=1 ;;
    --system-packages) system_only=1 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $arg (try --help)" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (sudo $0 $*): labctl creates namespaces and installs system packages" >&2
  exit 1
fi

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

# labctl then runs as root from this clone (its .venv, an editable install of labctl/, and the
# /usr/local/bin/labctl link into it): whoever may change a file here, or rename the clone or a
# directory above it, may run code as root. So the clone and every directory above it must be
# root's and writable by no one else (a sticky directory such as /tmp may be), unless
# LABCTL_INSTALL_ANY_OWNER=1 says that whoever owns it may run code as root anyway (a VM's only user).
untrusted_clone() {
  local d=$here parent owner mode bad
  while :; do
    parent=$(dirname "$d")
    owner=$(stat -c %u "$d")
    mode=$(stat -c %a "$d")
    if [ "$owner" != 0 ]; then echo "$d is owned by uid $owner"; return 0; fi
    # above the clone, a sticky directory lets no one else rename what is root's in it
    if [ "$d" != "$here" ] && [ $(( 8#$mode & 8#1000 )) -ne 0 ]; then break; fi
    if [ $(( 8#$mode & 8#022 )) -ne 0 ]; then echo "$d has mode $mode: others may write it"; return 0; fi
    [ "$d" = / ] && break
    d=$parent
  done
  bad=$(find "$here" ! -type l \( ! -uid 0 -o -perm /022 \) -print -quit 2>/dev/null)
  if [ -n "$bad" ]; then echo "$bad is owned by uid $(stat -c %u "$bad") with mode $(stat -c %a "$bad")"; return 0; fi
  return 1
}
if [ "${LABCTL_INSTALL_ANY_OWNER:-}" != 1 ] && why=$(untrusted_clone); then
  cat >&2 <<EOF
install.sh: refusing to install labctl from $here: $why.
  labctl runs as root from this clone (its .venv and an editable install), so whoever can change a
  file in it, or rename it, can run code as root.
  fix: clone it as root into a directory of root's, e.g.
         sudo git clone <this repository> /opt/labctl && sudo /opt/labctl/install.sh
       or, if whoever owns it may run code as root anyway (your own machine, a VM's only user):
         sudo LABCTL_INSTALL_ANY_OWNER=1 $0 $*
EOF
  exit 1
fi

# iproute2 (ip, tc), tcpdump/tshark (captures and RoCE decoding), ethtool, nftables (ECN marking),
# ping, and a Python >= 3.11 with venv. Mininet (the mininet backend, Mininet import and export, and
# bench/bringup.py's comparison) with what it needs beside it here: bridge-utils, and the system
# python3 it imports under. docker.io and debootstrap for container nodes and the images labctl
# builds from Debian packages (`labctl image build`). Nothing here starts a daemon on a machine
# without systemd (Open vSwitch comes along unused; labctl starts dockerd when a lab needs it).
# strace for the tests only: the prompt's test widens CPython readline's Ctrl-C window with it.
packages=(iproute2 tcpdump tshark ethtool nftables iputils-ping procps python3 python3-venv python3-pip
          mininet bridge-utils docker.io debootstrap strace)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  say "system packages present"
fi
[ "$system_only" = 1 ] && exit 0

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "install.sh: labctl needs Python >= 3.11; $($python --version 2>&1) found (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
if [ ! -x "$here/.venv/bin/python" ]; then
  say "creating virtualenv $here/.venv"
  "$python" -m venv "$here/.venv"
fi
# the box vm/build-box.sh makes carries a wheelhouse, so a guest that reaches no registry installs too
wheels=${LABCTL_WHEELS:-/opt/labctl/wheels}
pip_from=()
extras=test,docs
if [ -d "$wheels" ]; then
  # the guide is built on the host, not in a guest: the wheelhouse carries the test extra only
  pip_from=(--no-index --find-links "$wheels")
  extras=test
fi
# The install is editable, so a change to labctl's code needs no new install; one to pyproject.toml
# (dependencies, entry points) does. The stamp records what was installed, and a second run with the
# same pyproject.toml skips pip (a minute under an emulated CPU; delete .venv/.labctl-install to
# install again anyway, e.g. after removing a package from the venv). --no-compile: Python compiles a
# module when it is first imported, instead of pip compiling every module of every dependency
# (most of a fresh install's time, and under an emulated CPU minutes of it). Where
# PYTHONDONTWRITEBYTECODE is set (as in many containers) Python keeps nothing it compiles, and every
# agent would compile numpy again as it starts (0.23 s against 0.11 s here): there the whole
# virtualenv is compiled after pip, on every CPU at once (pip compiles on one: 44 s against 35 s).
compile_all() {   # every CPU at once where a process pool can start, else one
  "$here/.venv/bin/python" -m compileall -q -j 0 "$1" >/dev/null 2>&1 ||
    "$here/.venv/bin/python" -m compileall -q "$1" >/dev/null
}
stamp="$here/.venv/.labctl-install"
want="$(sha256sum "$here/pyproject.toml" | cut -d' ' -f1) [$extras] ${pip_from[*]}"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$here/.venv/bin/labctl" --version >/dev/null 2>&1; then
  say "labctl already installed in $here/.venv (editable, and pyproject.toml unchanged since)"
else
  say "installing labctl into $here/.venv${pip_from:+ from the wheelhouse $wheels}"
  rm -f "$stamp"
  "$here/.venv/bin/python" -m pip install -q --disable-pip-version-check --no-compile "${pip_from[@]}" -e "$here[$extras]"
  if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
    # a speed-up only, so never a failure: a file that does not compile (a package's template) is
    # skipped as pip skips it, and where a process pool cannot start (no /dev/shm) one process does it
    purelib=$("$here/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    compile_all "$purelib" || true
  fi
  printf '%s\n' "$want" >"$stamp"
fi
if [ -n "${PYTHONDONTWRITEBYTECODE:-}" ]; then
  # labctl's own modules too: the install is editable, so pip compiled none of them, and every
  # agent, helper and command would compile the ones it imports again (about 20 ms a process).
  # compileall only rewrites what changed since; a stale file is recompiled by Python as usual.
  compile_all "$here/labctl"
fi
ln -sf "$here/.venv/bin/labctl" /usr/local/bin/labctl
say "labctl $("$here/.venv/bin/labctl" --version | awk '{print $NF}') installed as /usr/local/bin/labctl"

if [ "$demo" -eq 1 ]; then
  lab=ls
  trap 'labctl down "$lab" >/dev/null 2>&1 || true' EXIT
  sets=()
  workload="$here/workloads/allreduce.yml"
  sizes="1 MB to 64 MB"
  if [ "$(systemd-detect-virt --vm 2>/dev/null)" = qemu ]; then
    # an emulated CPU (QEMU without KVM) runs the agents 5-10x slower: at dilation 4000 the
    # all-reduce ran at 6-12x its bound. Half the lab rate doubles the bound (measured under TCG:
    # 3-18x it, 384-827 s); at 16000 the links are no faster than the agents, and pauses behind
    # the slow controller held the all-reduce up to 9x the bound again. Seed 7 puts the ring's two
    # fabric hops on two spines (seed 1 shares one): a shared spine's queue needs PFC, and the
    # emulated controller (worst reaction over 200 ms) let it overflow (13,341 frames lost once).
    # Even then a spine queue formed and lost 73 frames to a controller slower than the 30 ms the
    # headroom is sized for: pfc_response=200ms sizes it for the emulated controller, as the VM
    # tier's experiments are.
    sets=(--set dilation=8000 --set hash_seed=7 --set pfc_response=200ms)
    say "emulated CPU (QEMU without KVM): the lab runs at dilation 8000, every rate 2x lower, ECMP seed 7 (the ring's hops on two spines) and PFC headroom sized for a 200 ms reaction (the emulated controller is that slow)"
    # the sizes to 64 MB took most of the demo's 340 s there; to 8 MB the demo shows the same steps
    workload=$(mktemp /tmp/labctl-demo-XXXXXX.yml)
    trap 'labctl down "$lab" >/dev/null 2>&1 || true; rm -f "$workload"' EXIT
    sed 's/end: 64MB/end: 8MB/' "$here/workloads/allreduce.yml" >"$workload"
    grep -q "end: 8MB" "$workload" || { echo "install.sh: workloads/allreduce.yml no longer ends at 64MB" >&2; exit 1; }
    sizes="1 MB to 8 MB: the emulated CPU is 5-10x slower"
  fi
  say "labctl up topologies/leaf-spine.yml ${sets[*]}"
  labctl up "$here/topologies/leaf-spine.yml" "${sets[@]}"
  say "labctl pingall $lab"
  labctl pingall "$lab"
  say "labctl route srv1-gpu0 srv2-gpu1 (four UDP source ports, as ECMP spreads them)"
  labctl route srv1-gpu0 srv2-gpu1 --lab "$lab" --sport 49152 --sport 49153 --sport 49154 --sport 49155
  say "labctl status $lab"
  COLUMNS=${COLUMNS:-140} labctl status "$lab"
  say "labctl run workloads/allreduce.yml (ring all-reduce of $sizes over the 8 GPUs, as RoCEv2)"
  out="$here/runs/$(date +%Y%m%d-%H%M%S)-demo-allreduce"
  labctl run "$workload" --lab "$lab" --out "$out"
  say "labctl down $lab"
  labctl down "$lab"
  trap - EXIT
  [ "$workload" = "$here/workloads/allreduce.yml" ] || rm -f "$workload"
  say "demo done: the lab came up, every GPU reached every other, the all-reduce ran (results in ${out#$here/}), and nothing is left behind"
fi
