"""The node package's entry point on a node: ~/.clustertrain/lib/<version>/node.py is this
file, beside the package (orchestrator/node/), so `python3 node.py VERB ...` finds it
first on its path whatever else the Python has installed."""

import sys

from orchestrator.node.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
