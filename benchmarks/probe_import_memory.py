"""What `import torch` costs every process that makes batches: private memory, and which libraries' loading adds it.

    python benchmarks/probe_import_memory.py [--python PATH]

A DataLoader worker is forked from a trainer that imported torch already, so it shares those pages;
each Ray worker is a new process that imports torch itself, so what this prints is paid once per
Ray worker (16 times at 16 CPUs). Prints the private and anonymous memory of a fresh process before
and after `import torch` (in a child process of ``--python``, default this interpreter), then, in
another fresh child, the anonymous memory that loading each shared library that `import torch` maps
adds (torch's own and, in a CUDA build, its ``nvidia`` packages', loaded whether or not a GPU is ever
used). Memory, not time: it may run beside anything.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap

_ROLLUP = """
import os
def rollup():
    out = {}
    for line in open(f"/proc/{os.getpid()}/smaps_rollup"):
        fields = line.split()
        if fields[0].endswith(":") and len(fields) > 1 and fields[1].isdigit():
            out[fields[0][:-1]] = int(fields[1]) >> 10
    return out
"""

_IMPORT = _ROLLUP + """
before = rollup()
import torch
torch.zeros(4).add_(1)
after = rollup()
private = lambda r: r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}): private {private(before)} -> {private(after)} MiB, "
      f"anonymous {before.get('Anonymous', 0)} -> {after.get('Anonymous', 0)} MiB, PSS {before['Pss']} -> {after['Pss']} MiB")
"""

# the shared libraries that `import torch` maps from its site-packages (torch's, the nvidia packages'),
# loaded one by one with RTLD_GLOBAL in a fresh process, dependencies first: by the number of
# libraries each needs, directly or not (`ldd`), as a dependency needs fewer than what needs it
_LISTING = """
import json, os, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
paths = set()
for line in open("/proc/self/maps"):
    fields = line.split()
    if len(fields) > 5 and fields[5].startswith(site) and ".so" in fields[5]:
        paths.add(fields[5])
print(json.dumps(sorted(paths)))
"""

_LIBS = _ROLLUP + """
import ctypes, json, os, subprocess, sys
def needs(path):
    try:
        return len(subprocess.run(["ldd", path], capture_output=True, text=True).stdout.splitlines())
    except OSError:  # no ldd: the order of the listing
        return 0
costs = []
for path in sorted(json.loads(sys.argv[1]), key=needs):
    before = rollup().get("Anonymous", 0)
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        continue
    costs.append((rollup().get("Anonymous", 0) - before, os.path.basename(path)))
print(f"loading the {len(costs)} libraries that import torch maps, one by one, added {sum(c for c, _ in costs)} MiB "
      "of anonymous memory; the largest:")
for cost, name in sorted(costs, reverse=True)[:6]:
    print(f"  {cost:5d} MiB  {name}")
"""


def _run(python: str, script: str, *args: str) -> str:
    result = subprocess.run([python, "-c", textwrap.dedent(script), *args], capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(result.stderr.strip().splitlines()[-1])
    return result.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose torch to measure")
    args = parser.parse_args()
    print(_run(args.python, _IMPORT))
    libraries = _run(args.python, _LISTING).splitlines()[-1]
    print(_run(args.python, _LIBS, libraries))


if __name__ == "__main__":
    main()
