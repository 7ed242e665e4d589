"""Everything that runs on a node, as one standard-library package: shipped to each node
once per version (orchestrator/cluster/nodelib.py) and called by verb (__main__.py).
Its modules import only the standard library and each other; the controller imports its
rules from here too, so that both ends read one copy (protocol.py, fault.py, queuelimits.py,
cordon.py, ...); the doctor's measurements import torch when they run, in the job's
environment."""
