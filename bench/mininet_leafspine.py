#!/usr/bin/python3
"""Build a labctl plan with Mininet's Python API and time it (run by bringup.py under /usr/bin/python3).

Same nodes and links as the labctl lab: routers and NVLink switches become Linux bridges (STP on,
so the leaf-spine loops cannot storm while we time), GPUs become hosts, every link a TCLink with
HTB at the lab rate (Mininet caps bw at 1000 Mbit/s). No controller. Prints one JSON line.
"""
import json
import sys
import time

from mininet.link import TCLink
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.nodelib import LinuxBridge

plan = json.load(open(sys.argv[1]))
setLogLevel("error")
t0 = time.perf_counter()
net = Mininet(topo=None, controller=None, switch=LinuxBridge, link=TCLink, build=False,
              autoSetMacs=True, waitConnected=False)
names = {}
for i, n in enumerate(plan["nodes"]):
    if n["forwarding"]:
        names[n["name"]] = net.addSwitch(f"s{i + 1}", stp=True, prio=i + 1).name
    else:
        names[n["name"]] = net.addHost(f"h{i + 1}").name
for lk in plan["links"]:
    a, b = lk["a"].split(":")[0], lk["b"].split(":")[0]
    net.addLink(names[a], names[b], bw=min(lk["lab_rate_bps"] / 1e6, 1000))
net.build()
net.start()
t1 = time.perf_counter()
net.stop()
t2 = time.perf_counter()
print(json.dumps({"up_s": t1 - t0, "down_s": t2 - t1}))
