"""Linux capabilities by name: the set a lab file may add to a container node (`cap_add:`), and
what this process holds (a container can be given only what its creator holds: runc refuses one
missing from the bounding set, and so Docker's `privileged` fails on a machine whose root lacks
any capability at all)."""
from __future__ import annotations

# capability(7) numbers 0..37, in order; PERFMON, BPF and CHECKPOINT_RESTORE (38..40) are left
# out: Docker 20.10 refuses names it does not know
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP",
    "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER",
    "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT", "SYS_ADMIN", "SYS_BOOT", "SYS_NICE",
    "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD", "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP",
    "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ")
NEWER = ("PERFMON", "BPF", "CHECKPOINT_RESTORE")     # 38..40: named here only to say which one is missing
# what an FRR image is given beyond a node's set: zebra will not start without SYS_ADMIN (it asks for
# net_admin, net_raw and sys_admin). A powerful line of the lab's (plan/trust.py)
FRR_EXTRA = ("SYS_ADMIN",)


def is_frr(image: str) -> bool:
    """labctl/frr, frrouting/frr:10.5.1, registry:5000/frr: the last path element, tag and digest off."""
    return image.split("@")[0].rsplit("/", 1)[-1].split(":")[0] == "frr"


def _bounding_mask() -> int:
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("CapBnd:")), 16)


def held() -> list[str]:
    """The capabilities in this process's bounding set, by name (what a container may be given)."""
    mask = _bounding_mask()
    return [name for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1]


def lacking() -> list[str]:
    """The capabilities the kernel knows that this process's bounding set lacks: Docker gives a
    privileged container every one the kernel knows, so with any of these missing runc fails it
    ("unable to apply caps: operation not permitted")."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = len(CAPABILITIES) - 1
    names = CAPABILITIES + NEWER
    mask = _bounding_mask()
    return [names[bit] if bit < len(names) else f"capability {bit}" for bit in range(last + 1)
            if not mask >> bit & 1]
