"""labctl: a miniature AI-training network built from Linux namespaces."""

__version__ = "0.1.0"
