"""The lab lifecycle, on top of a backend and the lab's record: build, find, look into, change, tear down.

    build.py    up, down, clean (and the helper processes a lab needs)
    labs.py     finding a lab by name or file; its plan; the backend that built it
    targets.py  NODE and NODE:PORT, resolved in one place
    inspect.py  status: the plan with what the kernel and the helpers say now
    reach.py    a flow's path as the kernels hash it; pingall
    runtime.py  links down/up with reconvergence, rates, ECN and PFC settings
    capture.py  pcapng captures on ports and WAN line ends
    software.py each node's exec lines, and the addresses they set
    convergence.py  when the lab's own routing software (FRR) has converged
"""
from labctl.lifecycle.build import CleanResult, build, clean, down, up  # noqa: F401
from labctl.lifecycle.inspect import helpers, live_links, status  # noqa: F401
from labctl.lifecycle.labs import backend_of, default_lab, find_lab, load_plan, require_root  # noqa: F401
from labctl.lifecycle.reach import ping_pairs, pingall, trace_path, why_none  # noqa: F401
from labctl.lifecycle.balance import dest_qp, set_mode as set_lb  # noqa: F401
from labctl.lifecycle.runtime import (converge_after_link_change, set_link_state, set_rate, tc_check,  # noqa: F401
                                      tc_set, tc_set_many)
from labctl.lifecycle.targets import address as node_address  # noqa: F401

from labctl.procs import HELPER_RT_PRIORITY  # noqa: F401,E402
