"""Container nodes: the Docker engine labctl talks to (engine.py), the containers that hold lab
nodes (nodes.py), and the images it builds without a registry (images.py)."""
