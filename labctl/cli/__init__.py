"""The labctl command line: a thin layer over lifecycle/, topology/, plan/, traffic/, exports/ and the API."""
from labctl.cli import cluster, containers, estimate, inspect, lifecycle, pipeline, prompt, queueing, traffic  # noqa: F401  (registers commands)
from labctl.cli.base import cli


def main():
    cli(prog_name="labctl")
