"""The labctl command line: a thin layer over lab.py, topology/, plan/, traffic/ and dataplane/."""
from labctl.cli import inspect, lifecycle, pipeline, queueing, traffic  # noqa: F401  (registers commands)
from labctl.cli.base import cli


def main():
    cli(prog_name="labctl")
