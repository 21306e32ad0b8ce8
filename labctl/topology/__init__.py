"""The topology: YAML (optionally rendered from a Jinja2 template) validated into typed models."""
