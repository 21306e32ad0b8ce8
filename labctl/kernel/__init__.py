"""The kernel toolkit: everything that speaks to the Linux kernel (netlink, namespaces, nftables,
BPF, sysctls, neighbours, veth wiring). It knows how to program a port or a namespace from a plan's
pieces, never how a lab is built; the backends and the data plane call it."""
