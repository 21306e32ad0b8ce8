#!/usr/bin/python3
"""The Mininet side of labctl's Mininet backend: builds a lab's nodes and links with Mininet's own
Python API and holds the network until it is told to stop.

It runs under the system Python (Debian's mininet package imports only there) and imports nothing
of labctl. It reads one JSON document on stdin:

    {"nodes": [{"name": "leaf1", "netns": "ls-leaf1"}, ...],
     "links": [{"a": "leaf1", "a_if": "spine1", "a_mac": "02:..", "b": ..., "b_if": ..., "b_mac": ...}]}

builds every node as a Mininet Node in its own namespace (no addresses: labctl configures them,
as it configures its own namespaces), every link as a Mininet Link with labctl's port names and
MACs, exposes each node's namespace as the named netns `netns` (`ip netns attach`, a bind mount of
/proc/PID/ns/net), prints "ready", and waits. SIGTERM runs net.stop() and exits. It never runs
`mn -c`, which cleans up machine-wide.
"""
import json
import signal
import subprocess
import sys
import threading

from mininet.link import Link
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.node import Node


def main():
    spec = json.loads(sys.stdin.read())
    setLogLevel("error")
    net = Mininet(topo=None, controller=None, build=False, autoSetMacs=False, autoStaticArp=False,
                  waitConnected=False)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for n in spec["nodes"]:
        net.addHost(n["name"], cls=Node, ip=None, inNamespace=True)
    for lk in spec["links"]:
        net.addLink(lk["a"], lk["b"], cls=Link, intfName1=lk["a_if"], intfName2=lk["b_if"],
                    addr1=lk["a_mac"], addr2=lk["b_mac"])
    net.build()
    for n in spec["nodes"]:
        subprocess.run(["ip", "netns", "attach", n["netns"], str(net.get(n["name"]).pid)], check=True)
    print("ready", flush=True)
    stop.wait()
    net.stop()


if __name__ == "__main__":
    main()
