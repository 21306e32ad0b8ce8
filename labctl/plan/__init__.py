"""Compiling a Topology into a LabPlan: every namespace, interface, address, route and queue. Pure code."""
