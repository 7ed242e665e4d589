"""Test job: says whether every rank sees the variable named by its first argument, by the
value's digest (never the value), then keeps running --sleep seconds."""
import hashlib
import os
import sys
import time

name, seconds = sys.argv[1], float(sys.argv[2])
value = os.environ.get(name)
digest = hashlib.sha256(value.encode()).hexdigest()[:16] if value is not None else "unset"
print(f"rank {os.environ.get('RANK')} {name} digest {digest}", flush=True)
time.sleep(seconds)
