"""Counters over time: samplers and the files they write into run directories."""
