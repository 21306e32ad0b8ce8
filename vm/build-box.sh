#!/usr/bin/env bash
# Build a Debian 12 Vagrant box for the libvirt provider from Debian packages alone (no Vagrant
# Cloud), with labctl's system packages installed, a wheelhouse of its Python dependencies (so that
# provisioning works in a guest that reaches no registry) and the virtualenv install.sh makes from
# it, ready in /vagrant/.venv. As root:
#
#   vm/build-box.sh [--cache DIR] [--force]     # then: vagrant box add labctl/debian12 DIR/<key>/labctl.box
#
# The box is keyed by a hash of this script, install.sh and pyproject.toml: the same
# inputs give the same key and the build is skipped (idempotent). The last line printed is the box.
# The kernel boots directly (libvirt's kernel/initrd, shipped inside the box): the image has no
# bootloader, and needs no loop device to build (mkfs.ext4 -d).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${LABCTL_VM_CACHE:-/var/cache/labctl/vm}
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --cache) cache=$2; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "build-box.sh: unknown option $1 (try --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "build-box.sh: run as root (debootstrap and chroot need it)" >&2; exit 1; }
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# labctl's own system packages come from install.sh, so the box and a bare machine cannot drift apart
mapfile -t labctl_pkgs < <(sed -n '/^packages=(/,/)/p' "$here/install.sh" | tr -d '()' | sed 's/packages=//' | tr ' ' '\n' | grep -v '^$')
base_pkgs=(linux-image-amd64 systemd-sysv udev dbus openssh-server sudo kmod ifupdown isc-dhcp-client rsync
           ca-certificates less)
# install.sh is in the key whole: it makes the box's virtualenv, not only its package list
key=$(cat "$0" "$here/pyproject.toml" "$here/install.sh" | sha256sum | cut -c1-16)
out="$cache/$key"
box="$out/labctl.box"
if [ -f "$box" ] && [ "$force" -eq 0 ]; then
  say "box cached: $box"
  echo "$box"
  exit 0
fi
for tool in debootstrap qemu-img mkfs.ext4; do
  command -v "$tool" >/dev/null || { echo "build-box.sh: $tool is missing (apt-get install debootstrap qemu-utils e2fsprogs)" >&2; exit 1; }
done
work=$(mktemp -d "$cache/build.XXXXXX" 2>/dev/null || { mkdir -p "$cache"; mktemp -d "$cache/build.XXXXXX"; })
# Interrupted, debootstrap leaves its unpacking (or, chrooted, its dpkg) running in the tree it
# builds, and /proc mounted there. It runs in a process group of its own, and the clean-up stops
# that group and any process whose root is in the build (the chrooted steps), unmounts whatever is
# under the build (deepest first), and never crosses a mount as it removes it.
builder=
cleanup() {
  set +e        # best effort: a process that is already gone must not end the clean-up
  local p r
  [ -n "$builder" ] && kill -9 -- "-$builder" 2>/dev/null
  for p in /proc/[0-9]*; do
    r=$(readlink "$p/root" 2>/dev/null) && [[ "$r" == "$work/"* ]] && kill -9 "${p#/proc/}" 2>/dev/null
  done
  sleep 0.2
  findmnt -rn -o TARGET | grep -F "$work/" | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
root="$work/rootfs"

say "debootstrap Debian 12 with ${#labctl_pkgs[@]} labctl packages (a few minutes)"
export DEBIAN_FRONTEND=noninteractive
include=$(IFS=,; echo "${base_pkgs[*]},${labctl_pkgs[*]}")
setsid debootstrap --variant=minbase --include="$include" bookworm "$root" http://deb.debian.org/debian \
  >"$work/debootstrap.log" 2>&1 &
builder=$!
wait "$builder" || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
builder=

say "configure: vagrant user and key, sudo, DHCP, ssh, /usr/sbin on PATH"
chroot "$root" useradd -m -s /bin/bash vagrant
install -d -m 700 -o 1000 -g 1000 "$root/home/vagrant/.ssh"
keyfile=$(ls /usr/share/rubygems-integration/all/gems/vagrant-*/keys/vagrant.pub 2>/dev/null | head -1)
[ -n "$keyfile" ] || { echo "build-box.sh: Vagrant's insecure key is missing: apt-get install vagrant" >&2; exit 1; }
install -m 600 -o 1000 -g 1000 "$keyfile" "$root/home/vagrant/.ssh/authorized_keys"
echo 'vagrant ALL=(ALL) NOPASSWD:ALL' > "$root/etc/sudoers.d/vagrant"
chmod 440 "$root/etc/sudoers.d/vagrant"
echo 'PATH="$PATH:/usr/sbin:/sbin"' > "$root/etc/profile.d/sbin-path.sh"
echo labctl > "$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 labctl\n' > "$root/etc/hosts"
echo '/dev/vda / ext4 defaults,errors=remount-ro 0 1' > "$root/etc/fstab"
cat > "$root/etc/network/interfaces" <<'EOF'
auto lo
iface lo inet loopback
allow-hotplug eth0
iface eth0 inet dhcp
EOF
# predictable names off: the first NIC is eth0 whatever bus the hypervisor puts it on
cmdline="console=ttyS0 root=/dev/vda rw net.ifnames=0 biosdevname=0"
printf 'UseDNS no\nHostKey /etc/ssh/ssh_host_ecdsa_key\nHostKey /etc/ssh/ssh_host_ed25519_key\n' >> "$root/etc/ssh/sshd_config"
chroot "$root" systemctl enable ssh >/dev/null 2>&1 || true
# docker and Open vSwitch stay off until labctl (or the user) starts them, as on the host
chroot "$root" systemctl disable docker.service docker.socket containerd.service openvswitch-switch.service >/dev/null 2>&1 || true
rm -f "$root/etc/ssh/ssh_host_"*
# each VM makes its own host keys at first boot: Ed25519 and ECDSA only, since an RSA key takes
# most of a boot's userspace time under an emulated CPU (18 of 26 s for `ssh-keygen -A`), and
# Vagrant's client takes either of the others
cat > "$root/etc/systemd/system/ssh-hostkeys.service" <<'EOF'
[Unit]
Description=Generate SSH host keys on first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key
[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -q -N "" -t ecdsa -f /etc/ssh/ssh_host_ecdsa_key
ExecStart=/usr/bin/ssh-keygen -q -N "" -t ed25519 -f /etc/ssh/ssh_host_ed25519_key
[Install]
WantedBy=multi-user.target
EOF
chroot "$root" systemctl enable ssh-hostkeys.service >/dev/null 2>&1
chroot "$root" apt-get clean

say "wheelhouse: labctl's Python dependencies for the guest's Python 3.11"
deps=$(python3 - "$here/pyproject.toml" <<'EOF'
import sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(p["dependencies"] + p["optional-dependencies"]["test"] + ["setuptools>=68", "wheel"]))
EOF
)
mkdir -p "$root/opt/labctl/wheels"
mapfile -t dep_list <<<"$deps"
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --platform manylinux2014_x86_64 \
  --platform manylinux_2_28_x86_64 --platform any --python-version 3.11 --implementation cp \
  -d "$root/opt/labctl/wheels" "${dep_list[@]}" 2> >(grep -v "is ignored: it is neither" >&2)

# The virtualenv a guest's provisioning would make, made here by install.sh itself (from the
# wheelhouse, as in a guest) and then compiled, on this machine's CPU. Under an emulated CPU the
# guest's own `python -m venv` and pip took 32 and 74 s of a 160 s `vagrant up`, and every first
# import of a dependency compiled it again. Vagrant's rsync keeps /vagrant/.venv (it excludes it
# and deletes nothing excluded) and install.sh then finds its stamp and skips pip. The sources
# are removed again: the guest's rsync brings the tree it runs.
say "labctl's virtualenv in /vagrant/.venv: install.sh from the wheelhouse, then compiled"
mkdir -m 755 "$root/vagrant"
tar -C "$here" --exclude=./.venv --exclude=./.git --exclude=./runs --exclude=./.vagrant --exclude=./labctl.egg-info -cf - . \
  | tar -C "$root/vagrant" --no-same-owner --no-same-permissions -xf -
# a guest's environment, not this shell's (a PYTHON=, LABCTL_WHEELS= or PYTHONDONTWRITEBYTECODE= here
# would name this machine's paths, or change what install.sh does)
in_box() { chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"; }
in_box bash /vagrant/install.sh >"$work/install.log" 2>&1 || { tail -20 "$work/install.log" >&2; exit 1; }
in_box /vagrant/.venv/bin/python -m compileall -q -j 0 /vagrant/.venv/lib >/dev/null
find "$root/vagrant" -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} +

say "disk image, kernel and box"
cp "$root"/boot/vmlinuz-* "$work/vmlinuz"
cp "$root"/boot/initrd.img-* "$work/initrd.img"
kernel=$(basename "$root"/boot/vmlinuz-* | sed 's/vmlinuz-//')
truncate -s 20G "$work/disk.raw"
mkfs.ext4 -q -F -L labctl -d "$root" "$work/disk.raw"
rm -rf "$root"
qemu-img convert -O qcow2 "$work/disk.raw" "$work/box.img"
rm -f "$work/disk.raw"
cat > "$work/metadata.json" <<'EOF'
{"provider": "libvirt", "format": "qcow2", "virtual_size": 20}
EOF
cat > "$work/Vagrantfile" <<EOF
# labctl/debian12 (vm/build-box.sh): kernel $kernel, booted directly by libvirt
Vagrant.configure("2") do |config|
  config.vm.provider "libvirt" do |lv|
    lv.kernel = File.expand_path("vmlinuz", __dir__)
    lv.initrd = File.expand_path("initrd.img", __dir__)
    lv.cmd_line = "$cmdline"
  end
end
EOF
mkdir -p "$out"
tar -C "$work" -cf "$box.part" metadata.json Vagrantfile box.img vmlinuz initrd.img
mv "$box.part" "$box"
# boxes of other inputs (an older install.sh or pyproject.toml) are 1.5 GB each and are built
# again if those inputs come back: only this one is kept. Only directories named by a key, each
# holding a labctl.box, are removed.
for old in "$cache"/*/labctl.box; do
  d=$(dirname "$old")
  [[ "$(basename "$d")" =~ ^[0-9a-f]{16}$ ]] && [ "$d" != "$out" ] && rm -rf "$d"
done
say "box built: $box (kernel $kernel, $(du -h "$box" | cut -f1))"
echo "$box"
