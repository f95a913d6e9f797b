"""The Triton kernels in a cache directory, counted by name (a launch's compiles).

    python3 scripts/triton_cache_count.py DIR
"""

import collections
import glob
import json
import sys

count = collections.Counter()
for f in glob.glob(sys.argv[1] + "/*/*.json"):
    try:
        meta = json.load(open(f))
    except (OSError, ValueError):
        continue
    if isinstance(meta, dict) and "name" in meta and "child_paths" not in meta:
        count[meta["name"]] += 1
print("== Triton kernels compiled:", sum(count.values()), dict(count.most_common()))
