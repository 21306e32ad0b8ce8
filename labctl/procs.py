"""Which process is which: a PID alone is reused, a PID with its start time is not.

labctl journals every process it starts as "PID:START" (START is the kernel's start time of the
process, in clock ticks since boot, field 22 of /proc/PID/stat). Before it signals a journaled
process it reads the start time again: an agent that ended long ago, or a PID reused by another
program (after a reboot, or after the PID space wrapped), has another start time or none, and is
left alone.
"""
from __future__ import annotations

import contextlib
import os
import resource

# Scheduling of the lab's own processes. The controller and the WAN line stand in for switch
# hardware, which never waits for the hosts' CPUs: they run SCHED_FIFO. Whatever holds the
# kernel's rtnl lock while the controller may need it runs real-time too, one level lower, for as
# long as it holds it: a time-shared thread preempted with the lock held stalled the controller for
# up to 32 ms behind two CPU-burning processes (priority inversion: kernel mutexes lend no
# priority). The queue sampler is real-time only for its netlink dumps (in_kernel, once per
# sample); running it real-time throughout took so much CPU from the agents that ring collectives
# ran 20% slower.
HELPER_RT_PRIORITY = 10
RTNL_READER_RT_PRIORITY = 5
HELPER_NICE = -10          # where real-time scheduling is refused (a container without CAP_SYS_NICE)


def start_time(pid: int) -> int | None:
    """The process's start time, or None if there is no such (living) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return int(fields[19])


def identity(pid: int) -> str:
    """What the journal records for a process labctl just started."""
    return f"{pid}:{start_time(pid) or 0}"


def boot_id() -> str:
    """This boot's random ID (the kernel makes a new one at every start): a journal entry made
    under another boot names a process or namespace that no longer exists."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def verified(entry: str) -> int | None:
    """The PID of a journaled "PID:START" if that very process still runs, else None.

    An entry without a start time (written by an older labctl) cannot be proven and is never used."""
    pid_text, sep, start_text = entry.partition(":")
    if not sep or not pid_text.isdigit() or not start_text.isdigit():
        return None
    pid = int(pid_text)
    if pid <= 1 or pid == os.getpid():
        return None
    start = start_time(pid)
    return pid if start is not None and start == int(start_text) else None


def prioritise(pid: int, priority: int = HELPER_RT_PRIORITY) -> str:
    """Schedule a process (or, with pid 0, the calling thread) real-time, else at nice -10; says which."""
    try:
        os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(priority))
        return f"SCHED_FIFO {priority}"
    except OSError:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, HELPER_NICE)
        return f"nice {HELPER_NICE}"


@contextlib.contextmanager
def in_kernel(priority: int = RTNL_READER_RT_PRIORITY):
    """A time-shared thread real-time for one short kernel call, with two syscalls and no lookups."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


@contextlib.contextmanager
def realtime(priority: int = RTNL_READER_RT_PRIORITY):
    """The calling thread runs real-time for the block, and as before afterwards."""
    policy, param, nice = os.sched_getscheduler(0), os.sched_getparam(0), os.getpriority(os.PRIO_PROCESS, 0)
    prioritise(0, priority)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, param)
            os.setpriority(os.PRIO_PROCESS, 0, nice)


def prioritise_all(pid: int, priority: int = HELPER_RT_PRIORITY) -> str:
    """Every thread of a running process real-time (a policy belongs to a thread: one set on the
    process's PID reaches only its main thread); threads it starts later inherit it."""
    said = prioritise(pid, priority)
    try:
        tasks = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    except OSError:
        return said
    for tid in tasks:
        prioritise(tid, priority)
    return said


def share_cpu_group(pid: int) -> bool:
    """Move a process into this process's CPU cgroup (cgroup v1's `cpu` hierarchy), where labctl's
    helpers run real-time: a container's own group has no real-time budget (cpu.rt_runtime_us 0
    under CONFIG_RT_GROUP_SCHED), so its processes cannot be made SCHED_FIFO there. True if moved."""
    try:
        own = next(line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup")
                   if "cpu" in line.split(":", 2)[1].split(","))
        mount = next(line.split()[4] for line in open("/proc/self/mountinfo")
                     if " - cgroup " in line and "cpu" in line.split()[-1].split(","))
        with open(os.path.join(mount, own.lstrip("/"), "cgroup.procs"), "w") as f:
            f.write(str(pid))
        return True
    except (OSError, StopIteration, IndexError):
        return False


def raise_fd_limit(need: int) -> None:
    """A large lab needs thousands of descriptors (sockets per namespace and per port): raise the soft
    limit toward the hard one, as far as needed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard) if hard != resource.RLIM_INFINITY else need,
                                                    hard))


def mem_available() -> int | None:
    """This host's MemAvailable in bytes (None where /proc/meminfo says nothing of it)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
