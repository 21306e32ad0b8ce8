#!/usr/bin/env bash
# The VM tier: labctl inside a Vagrant VM (libvirt; KVM where it works, else TCG), on the guest's
# own stock Debian kernel. As root:
#
#   vm/test-vm.sh            build or reuse the box, vagrant up, then in the guest: doctor, the
#                            README's demo, experiments/incast-pfc.yml and ecmp-entropy.yml, and the
#                            root test modules for sysctls, routing, shaping and VXLAN; then destroy
#   vm/test-vm.sh --smoke    box, vagrant up, doctor, demo, destroy (what CI runs)
#   vm/test-vm.sh --packages only install Vagrant, libvirt and QEMU if missing (CI does first)
#   vm/test-vm.sh --box      only build the box if it is not cached (CI builds it beside its first part)
#   vm/test-vm.sh --repeat N EXPERIMENT
#                            box, vagrant up, doctor, then experiments/EXPERIMENT.yml N times in
#                            one guest, each kept under LABCTL_VM_KEEP as EXPERIMENT-K.tar.gz, and
#                            a tally of passes: for a step that passes or fails from run to run
#   LABCTL_VM_KEEP=DIR       keep each experiment's directory from the guest in DIR, passed or failed
#   LABCTL_VM_BOOT_AFTER=F   once the box is ready, wait until file F exists before booting (CI)
#
# Installs Vagrant, vagrant-libvirt, libvirt and QEMU if missing. libvirtd and virtlogd are started
# here, in a network namespace of their own (their bridge, dnsmasq and NAT stay out of the host's),
# with a qemu.conf bound over the host's in a private mount namespace (the host's file is untouched),
# and stopped at the end with everything they made: no VM, volume, network or daemon is left
# (the box, and its disk as libvirt holds it, stay in the cache: $LABCTL_VM_CACHE/<key>/).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mode=full
case "${1:-}" in
  --smoke) mode=smoke ;;
  --packages) mode=packages ;;
  --box) mode=box ;;
  --repeat)
    mode=repeat; repeat=${2:-}; repeat_exp=${3:-}
    [[ "$repeat" =~ ^[1-9][0-9]?$ ]] || { echo "test-vm.sh: --repeat takes a count from 1 to 99, then an experiment" >&2; exit 2; }
    [[ "$repeat_exp" =~ ^[a-z0-9-]+$ ]] && [ -f "$here/experiments/$repeat_exp.yml" ] ||
      { echo "test-vm.sh: no experiment '$repeat_exp' (one of: $(cd "$here/experiments" && ls *.yml | sed 's/\.yml$//' | tr '\n' ' '))" >&2; exit 2; } ;;
  "") ;;
  -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
  *) echo "test-vm.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "test-vm.sh: run as root (sudo $0)" >&2; exit 1; }
say() { printf '\033[1m==> [vm %s] %s\033[0m\n' "$(date +%T)" "$*"; }
t_start=$(date +%s)

cache=${LABCTL_VM_CACHE:-/var/cache/labctl/vm}
ns=labctl-vm
run=$(mktemp -d /tmp/labctl-vm.XXXXXX)
export VAGRANT_HOME="$cache/vagrant-home"
export VAGRANT_DOTFILE_PATH="$run/dotfile"          # not .vagrant/ in the repository
export VAGRANT_DEFAULT_PROVIDER=libvirt
export VAGRANT_CHECKPOINT_DISABLE=1 VAGRANT_NO_PARALLEL=1
export LABCTL_BOX=labctl/debian12
export LABCTL_VM_NETWORK="labctl-vagrant=10.123.121.0/24"
export VAGRANT_VAGRANTFILE="$here/Vagrantfile"
mkdir -p "$cache" "$VAGRANT_HOME"

packages=(vagrant vagrant-libvirt libvirt-daemon-system qemu-system-x86 qemu-utils dnsmasq-base rsync debootstrap
          e2fsprogs)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[ "$mode" = packages ] && { rmdir "$run"; exit 0; }
if [ "$mode" = box ]; then
  rmdir "$run"
  t=$(date +%s)
  box=$("$here/vm/build-box.sh" | tail -1)
  say "box ready in $(( $(date +%s) - t )) s: $box"
  exit 0
fi

in_ns() { ip netns exec "$ns" "$@"; }
vg() { (cd "$here" && in_ns vagrant "$@"); }
guest() { say "guest: $*"; vg ssh -c "$*"; }

pools_before="" domains_before="" volumes_before="" cached_pool=""
virsh_() { virsh -c qemu:///system "$@"; }
cleanup() {
  set +e
  say "cleaning up"
  if [ -S /run/libvirt/libvirt-sock ] && [ -f "$run/libvirtd.pid" ]; then
    [ -d "$VAGRANT_DOTFILE_PATH" ] && vg destroy -f >/dev/null 2>&1
    for dom in $(virsh_ list --all --name | grep '^labctl_'); do
      grep -qx "$dom" <<<"$domains_before" && continue    # a VM defined before this run is the user's
      virsh_ destroy "$dom" >/dev/null 2>&1
      virsh_ undefine "$dom" --remove-all-storage >/dev/null 2>&1
    done
    # every active network was started by this daemon (none ran before it): stop them all, so no
    # dnsmasq outlives it, but remove only the definition vagrant-libvirt made for this tier
    for net in $(virsh_ net-list --name); do virsh_ net-destroy "$net" >/dev/null 2>&1; done
    virsh_ net-undefine labctl-vagrant >/dev/null 2>&1
    for pool in $(virsh_ pool-list --all --name); do
      # the box's volume (labctl-VAGRANTSLASH-...) and the VM's disk (labctl_default.img) are ours
      for vol in $(virsh_ vol-list "$pool" 2>/dev/null | awk 'NR>2 && $1 ~ /^labctl/ {print $1}'); do
        grep -qx "$pool/$vol" <<<"$volumes_before" && continue
        [ "$pool" = "${cached_pool:-}" ] && [[ "$vol" == labctl-VAGRANTSLASH-* ]] && continue   # the box's, kept
        virsh_ vol-delete "$vol" --pool "$pool" >/dev/null 2>&1
      done
      grep -qx "$pool" <<<"$pools_before" && continue     # a pool that was there before is not ours
      virsh_ pool-destroy "$pool" >/dev/null 2>&1
      virsh_ pool-undefine "$pool" >/dev/null 2>&1
    done
  fi
  for d in libvirtd virtlogd; do
    if [ -f "$run/$d.pid" ]; then
      pid=$(cat "$run/$d.pid")
      kill "$pid" 2>/dev/null
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
  [ -n "${made_ns:-}" ] && ip netns del "$ns" 2>/dev/null
  [ -n "${made_run_dir:-}" ] && rm -rf /run/libvirt
  rm -rf "$run"
  left=$(pgrep -fa 'qemu-system|libvirtd|virtlogd|dnsmasq.*libvirt' | grep -v pgrep || true)
  [ -z "$left" ] && say "nothing left: no VM, daemon or namespace" || echo "test-vm.sh: left running: $left" >&2
  say "total $(( $(date +%s) - t_start )) s"
}
trap cleanup EXIT
trap 'exit 130' INT     # so that the EXIT trap runs whatever signal ends the tier (bash skips it on SIGINT)
trap 'exit 143' TERM

if pgrep -x libvirtd >/dev/null; then
  echo "test-vm.sh: a libvirtd is already running; this tier starts and stops its own" >&2
  exit 1
fi
say "libvirtd and virtlogd in netns $ns (qemu runs as root here: no udev to hand /dev/kvm over)"
if [ -e "/run/netns/$ns" ]; then
  echo "test-vm.sh: netns $ns exists (another run, or one that was killed: ip netns del $ns)" >&2
  exit 1
fi
ip netns add "$ns" && made_ns=1
in_ns ip link set lo up
cp /etc/libvirt/qemu.conf "$run/qemu.conf"
printf 'user = "root"\ngroup = "root"\nstdio_handler = "file"\n' >> "$run/qemu.conf"
[ -d /run/libvirt ] || made_run_dir=1          # the daemon's runtime state goes with it
mkdir -p /run/libvirt /var/lib/libvirt/images
in_ns virtlogd -d -p "$run/virtlogd.pid"
in_ns unshare --mount --propagation private sh -c 'mount --bind "$1" /etc/libvirt/qemu.conf && exec libvirtd -d -p "$2"' \
  sh "$run/qemu.conf" "$run/libvirtd.pid"
for _ in $(seq 100); do [ -S /run/libvirt/libvirt-sock ] && break; sleep 0.1; done
virsh_ version >/dev/null
# what this daemon finds already defined (a user's own VMs, pools, volumes) is left as it is
pools_before=$(virsh_ pool-list --all --name)
domains_before=$(virsh_ list --all --name)
volumes_before=$(for p in $pools_before; do virsh_ vol-list "$p" 2>/dev/null | awk -v p="$p" 'NR>2 && $1 {print p "/" $1}' || true; done)

t=$(date +%s)
box=$("$here/vm/build-box.sh" | tail -1)
say "box ready in $(( $(date +%s) - t )) s: $box"
if ! VAGRANT_HOME="$VAGRANT_HOME" vagrant box list 2>/dev/null | grep -q "^$LABCTL_BOX "; then
  vagrant box add --force --name "$LABCTL_BOX" "$box" >/dev/null
elif [ "$box" -nt "$VAGRANT_HOME/boxes/labctl-VAGRANTSLASH-debian12/0/libvirt/box.img" ]; then
  # rebuilt: replace the added one. Its image is what the add wrote; the box's directory keeps the
  # time of the first add, so a box rebuilt since was added again, and uploaded again, on every run
  vagrant box add --force --name "$LABCTL_BOX" "$box" >/dev/null
fi

# The box's disk, uploaded into libvirt's storage once and kept beside the box: vagrant-libvirt
# sends 1.6 GB through libvirt in 250 KB pieces on every `up` otherwise, finds the volume and skips
# that when it is there. The pool is this daemon's `default`, defined over that directory for the
# run; the VM's own disk (a copy-on-write layer over it) goes at the end, the box's disk stays. A
# disk whose upload was cut short is never used: only the one an `up` booted from is named as kept.
box_pool="$(dirname "$box")/pool"
if ! virsh_ pool-info default >/dev/null 2>&1; then     # transient: it goes with this daemon
  mkdir -p "$box_pool"
  kept=$(cat "$box_pool.uploaded" 2>/dev/null || true)
  for f in "$box_pool"/*; do      # a VM disk or an upload left by a run that was killed
    [ -e "$f" ] && [ "$(basename "$f")" != "$kept" ] && rm -f -- "$f"
  done
  virsh_ pool-create-as default dir --target "$box_pool" >/dev/null
  cached_pool=default
fi

if [ -n "${LABCTL_VM_BOOT_AFTER:-}" ]; then
  # CI builds the box beside its first part, and boots the guest once that part is over
  say "box ready; waiting for $LABCTL_VM_BOOT_AFTER before booting"
  until [ -e "$LABCTL_VM_BOOT_AFTER" ]; do sleep 1; done
fi
t=$(date +%s)
say "vagrant up (accel ${LABCTL_VM_ACCEL:-auto})"
# vagrant-libvirt redraws its upload progress thousands of times on one line: keep the log readable
export LABCTL_VM_CONSOLE="$run/console.log"     # the guest's serial console (Vagrantfile)
up() { vg up --provider=libvirt | sed -u 's/\x1b\[KProgress: [0-9]*%//g'; }
if ! up; then
  # once in CI a TCG guest never asked for an address within the 900 s boot time-out; its console
  # was not kept then. Now it is shown, and the boot is tried once more, in the log for all to see.
  say "vagrant up failed after $(( $(date +%s) - t )) s; the guest's console ended with:"
  tail -n 40 "$LABCTL_VM_CONSOLE" 2>/dev/null || echo "(no console output)"
  vg destroy -f || true
  if [ -n "${cached_pool:-}" ]; then      # an upload that failed part-way is not booted from
    for f in "$box_pool"/labctl-VAGRANTSLASH-*; do
      [ -e "$f" ] && [ "$(basename "$f")" != "$kept" ] && virsh_ vol-delete "$(basename "$f")" --pool default >/dev/null 2>&1
    done
  fi
  say "vagrant up: one more try"
  t=$(date +%s)
  if ! up; then
    say "vagrant up failed twice; the guest's console ended with:"
    tail -n 40 "$LABCTL_VM_CONSOLE" 2>/dev/null || echo "(no console output)"
    exit 1
  fi
fi
say "vagrant up in $(( $(date +%s) - t )) s"
if [ -n "${cached_pool:-}" ]; then
  # the disk this VM booted from (a box added again is uploaded under a new name; the next run
  # removes any other)
  backing=$(qemu-img info -U --output=json "$box_pool/labctl_default.img" 2>/dev/null |
            python3 -c 'import json, os, sys; print(os.path.basename(json.load(sys.stdin).get("backing-filename", "")))' \
            2>/dev/null) || backing=""
  box_img="$VAGRANT_HOME/boxes/labctl-VAGRANTSLASH-debian12/0/libvirt/box.img"
  # whole: as long as the box's own image (an upload cut short is shorter)
  if [ -n "$backing" ] && [ -f "$box_pool/$backing" ] &&
     [ "$(stat -c %s "$box_pool/$backing")" = "$(stat -c %s "$box_img" 2>/dev/null)" ]; then
    echo "$backing" > "$box_pool.uploaded"
  fi
fi

failed=()
step() {   # a guest step: timed, and a failure is recorded so that every step runs and is reported
  local what=$1; shift
  local t0; t0=$(date +%s)
  step_failed=""
  if guest "$@"; then say "$what passed in $(( $(date +%s) - t0 )) s"
  else say "$what FAILED after $(( $(date +%s) - t0 )) s"; failed+=("$what"); step_failed=1; fi
}
# a failed experiment shows its answer and the end of its controller's log here; with LABCTL_VM_KEEP
# set, every experiment's whole directory (report, runs, and lab/: pfc.json with the controller's
# reaction times and pauses) is copied out of the guest before destroy, as
# <LABCTL_VM_KEEP>/<experiment>.tar.gz: a failure is read beside a passing run of the same step
show_experiment() {
  guest "sudo sed -n '/^## Answer/,/^## [^A]/p' /tmp/$1/report.md; sudo tail -n 20 /tmp/$1/lab/controller.log" || true
  # the guest kernel's own word on a stall: RT throttling, soft lock-ups, an unstable clocksource
  guest "sudo dmesg | grep -iE 'throttl|lockup|clocksource|hung|rcu' | tail -n 20" || true
}
keep_experiment() {   # DIR [NAME]: /tmp/DIR in the guest, kept as NAME.tar.gz
  if [ -n "${LABCTL_VM_KEEP:-}" ]; then
    mkdir -p "$LABCTL_VM_KEEP"
    local name=${2:-$1}
    # base64: the ssh session may be a terminal, which would not carry binary bytes intact
    vg ssh -c "sudo sh -c 'dmesg > /tmp/$1/dmesg.txt'; sudo tar -C /tmp -cz $1 | base64 -w0" | tr -d '\r' | base64 -d > "$LABCTL_VM_KEEP/$name.tar.gz" &&
      say "kept $LABCTL_VM_KEEP/$name.tar.gz" || say "could not copy /tmp/$1 out of the guest"
  fi
}
# an emulated CPU runs the agents and the controller 5-10x slower (README, "Prefer a VM?"), so the
# experiments there size PFC headroom for the emulated controller (qos.pfc_response), and a lower lab
# rate leaves room for that headroom in the fixed buffer. The incast's controller took 80 ms at p99
# and 96-123 ms at worst in undisturbed runs, over 200 ms while the host ran other work: it runs at
# dilation 32000 with headroom for 400 ms (the same bytes as 16000 and 200 ms, twice the time).
# ecmp-entropy runs at 64000, so that the network, not the agents, paces its all-reduces.
tcg_sets() {   # EXPERIMENT: its --set options on an emulated CPU, as a guest-side shell expansion
  local d r
  case "$1" in
    incast-pfc) d=32000 r=400ms ;;
    ecmp-entropy) d=64000 r=200ms ;;
    *) d=16000 r=200ms ;;
  esac
  echo "\$( [ \"\$(systemd-detect-virt --vm)\" = qemu ] && echo --set dilation=$d --set pfc_response=$r )"
}
# shaping at 1 Gbit/s needs a sender faster than that: an emulated one reaches about 0.7 Gbit/s
shaping='k=""; [ "$(systemd-detect-virt --vm)" = qemu ] && k="not 1G and not 400G"; '
step doctor 'echo "guest kernel: $(uname -r), CPU: $(systemd-detect-virt --vm)"; sudo COLUMNS=150 labctl doctor'
if [ "$mode" = repeat ]; then
  passes=0
  for k in $(seq "$repeat"); do
    step "$repeat_exp run $k of $repeat" "cd /vagrant && sudo rm -rf /tmp/$repeat_exp && sudo labctl run experiments/$repeat_exp.yml --out /tmp/$repeat_exp $(tcg_sets "$repeat_exp")"
    if [ -n "$step_failed" ]; then show_experiment "$repeat_exp"; else passes=$((passes + 1)); fi
    keep_experiment "$repeat_exp" "$repeat_exp-$k"
  done
  say "$repeat_exp passed $passes of $repeat runs in one guest"
else
  step demo 'cd /vagrant && sudo ./install.sh --demo'
fi
if [ "$mode" = full ]; then
  for e in incast-pfc ecmp-entropy; do
    step "experiment $e" "cd /vagrant && sudo labctl run experiments/$e.yml --out /tmp/$e $(tcg_sets "$e")"
    [ -n "$step_failed" ] && show_experiment "$e"
    keep_experiment "$e"
  done
  step "root test modules" "$shaping"'cd /vagrant && sudo .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_netns_lab.py tests/test_netns_flowhash.py tests/test_netns_shaping.py tests/test_netns_vxlan.py -k "$k"'
fi
t=$(date +%s)
vg destroy -f
say "destroy in $(( $(date +%s) - t )) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test-vm.sh: failed in the guest: ${failed[*]}" >&2
  exit 1
fi
say "every guest step passed"
