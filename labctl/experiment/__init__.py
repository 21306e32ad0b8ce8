"""Experiments: build a lab, play traffic, change things, capture, plot, and check expectations."""
