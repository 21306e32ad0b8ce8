"""Labs over several machines: the machines labctl knows, the Swarm that joins them, the VXLAN
links that cable nodes across them, and a way to emulate machines on one host."""
