"""Everything that runs on a node, as one standard-library package: shipped to each node
once per version (orchestrator/cluster/nodelib.py) and called by verb (__main__.py).
Its modules import only the standard library and each other (protocol.py is what the
controller imports of it too); the doctor's measurements import torch when they run, in
the job's environment."""
