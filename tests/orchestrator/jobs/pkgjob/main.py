"""Test job run as a module (`train -m pkgjob.main`): a relative import in its package."""
import os
import sys

from . import util

print(f"rank {os.environ['RANK']} module {__spec__.name} name {__name__} util {util.VALUE} "
      f"argv {sys.argv[1:]}", flush=True)
