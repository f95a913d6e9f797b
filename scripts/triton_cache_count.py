"""The Triton kernels in a cache directory, counted by name (a launch's compiles): python3 scripts/triton_cache_count.py DIR"""
import collections, glob, json, sys
c = collections.Counter()
for f in glob.glob(sys.argv[1] + "/*/*.json"):
    try:
        d = json.load(open(f))
    except Exception:
        continue
    if isinstance(d, dict) and "name" in d and "child_paths" not in d:
        c[d["name"]] += 1
print("== Triton kernels compiled:", sum(c.values()), dict(c.most_common()))
