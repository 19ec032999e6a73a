"""Run megatron-energon's own public test suite against energon_ray (issue 17's yardstick).

    pip install --target /tmp/tvlib --no-deps torchvision soundfile   # the suite's own test dependencies
    python benchmarks/energon_suite.py --energon-repo /path/to/Megatron-Energon --extra-path /tmp/tvlib [-k EXPR] [--only-public]
    # with a CPU-only torch and PyPI's (CUDA) torchvision wheel: add --torchvision-cpu-shim

What it does:

1. copies the ``tests/`` folder of an Energon checkout (a work tree or a bare git directory: then
   ``git archive HEAD tests``) into a temporary folder, twice;
2. in the second copy, rewrites the imports of Energon's *public* names to ``energon_ray``: the top
   level (``from megatron.energon import …``) and the submodules Energon's documents point users to
   (``megatron.energon.av``, ``.media`` and ``.media.metadata`` (where Energon defines what
   ``.media`` exports), ``.transforms``, ``.cache``, ``.task_encoder.cooking``,
   ``.task_encoder.base``). Everything else (``EPath``, ``BaseWebdatasetFactory.prepare_dataset``,
   the ``energon`` CLI used to prepare test data)
   stays Energon's, so the test data is prepared by Energon and only the code under test changes;
3. runs pytest on both copies (fresh processes, ``--junitxml``; Ray shut down after each test:
   ``energon_suite_ray_reset.py``) and compares test by test.

A test *uses only public names* when the body of its test method refers to no name that its module
imported from a non-public Energon module (set-up and tear-down methods are not counted: they prepare
data). ``--only-public`` runs only those. Reported: passes on Energon, passes on energon_ray, and the
public-only subset of both, plus the failing public-only tests with the first line of their error.

Nothing here is run by the test suite; Energon's tests are not vendored (they stay in its repository).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Set, Tuple

#: where test-only packages of Energon's suite (torchvision, soundfile) live, e.g. ``pip install --target``
EXTRA_PATHS: List[str] = []
PUBLIC_MODULES = ("megatron.energon", "megatron.energon.av", "megatron.energon.edataclass", "megatron.energon.flavors",
                  "megatron.energon.media", "megatron.energon.media.metadata", "megatron.energon.transforms", "megatron.energon.cache",
                  "megatron.energon.task_encoder.cooking", "megatron.energon.task_encoder.base")
# ``megatron.energon.edataclass`` is a module there and the decorator itself here (as at Energon's top
# level): its imports stay Energon's, whose decorator makes plain dataclasses either package reads.
_REWRITE = re.compile(r"^(\s*)(from|import) megatron\.energon(\.(?:av|media\.metadata|media|transforms|cache|task_encoder\.cooking|task_encoder\.base))?(\s)", re.M)


def copy_tests(repo: Path, dest: Path) -> Path:
    """``tests/`` of an Energon checkout (work tree or bare git directory) into ``dest/tests``."""
    dest.mkdir(parents=True, exist_ok=True)
    if (repo / "tests").is_dir():
        shutil.copytree(repo / "tests", dest / "tests")
    else:
        archive = subprocess.run(["git", "--git-dir", str(repo), "archive", "HEAD", "tests"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "tests"


def rewrite(tests: Path) -> None:
    """Point the public-name imports of every test module at energon_ray."""
    for path in tests.rglob("*.py"):
        text = path.read_text()
        new = _REWRITE.sub(lambda m: f"{m.group(1)}{m.group(2)} energon_ray{m.group(3) or ''}{m.group(4)}", text)
        if new != text:
            path.write_text(new)


def public_only_tests(tests: Path) -> Set[str]:
    """``module::Class::test`` ids whose test body uses no name imported from a non-public module."""
    found: Set[str] = set()
    for path in sorted(tests.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        private: Set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("megatron.energon"):
                if node.module not in PUBLIC_MODULES:
                    private.update(a.asname or a.name for a in node.names)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("megatron.energon") and a.name not in PUBLIC_MODULES:
                        private.add((a.asname or a.name).split(".")[0])
        for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_"):
                    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
                    strings = " ".join(n.value for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str))
                    if not names & private and "megatron.energon" not in strings:
                        found.add(f"{path.stem}::{cls.name}::{fn.name}")
    return found


def run_pytest(tests: Path, junit: Path, extra: List[str], timeout: int, only: Set[str] = frozenset()) -> Dict[str, Tuple[str, str]]:
    """``id -> (outcome, first line of the message)`` of one pytest run in a fresh process."""
    paths = [str(tests.parent), str(Path(__file__).resolve().parent), *EXTRA_PATHS, os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=os.pathsep.join(p for p in paths if p))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors", "--rootdir", str(tests.parent),
           f"--junitxml={junit}", "-o", "faulthandler_timeout=" + str(timeout), "-p", "energon_suite_ray_reset", *extra]
    # ``only``: the modules that hold them (a test id in a module that fails to import, e.g. without
    # torchvision, would make pytest refuse the whole command line); results are filtered below
    cmd += sorted({f"{tests}/{t.split('::')[0]}.py" for t in only}) if only else [str(tests)]
    subprocess.run(cmd, cwd=tests.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results: Dict[str, Tuple[str, str]] = {}
    if not junit.exists():
        return results
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        test_id = f"{module[-2] if len(module) > 1 else module[0]}::{module[-1]}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (child.get("message") or "").strip().splitlines()[0][:160] if child.get("message") else ""
                break
        if not only or test_id in only or case.get("name", "").startswith("tests."):  # (collection errors)
            results[test_id] = (outcome, message)
    return results


#: a ``sitecustomize`` for ``--torchvision-cpu-shim``: torchvision's CUDA wheel on a CPU-only torch
#: cannot load its operator library, and its import then stops registering shapes for two operators
#: that library would have declared; declaring them first lets the pure-Python transforms import
#: (nothing calls them). Not for a torch whose torchvision library loads (it would clash).
TORCHVISION_CPU_SHIM = """\
try:
    import torch
    _LIB = torch.library.Library("torchvision", "DEF")
    for _op in ("nms", "qnms"):
        _LIB.define(_op + "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
except Exception:
    pass
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--energon-repo", type=Path, required=True)
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument("--only-public", action="store_true", help="run only tests that use only public names")
    parser.add_argument("--skip-reference", action="store_true", help="do not run the suite on Energon itself")
    parser.add_argument("--timeout", type=int, default=300, help="per-test faulthandler timeout, seconds")
    parser.add_argument("--extra-path", action="append", default=[],
                        help="folder with the suite's own test dependencies (pip install --target DIR torchvision soundfile)")
    parser.add_argument("--torchvision-cpu-shim", action="store_true",
                        help="declare torchvision's nms/qnms operator schemas at start-up (a sitecustomize): lets "
                             "PyPI's CUDA torchvision wheel import its Python transforms on a CPU-only torch")
    args = parser.parse_args()
    EXTRA_PATHS.extend(args.extra_path)

    work = Path(tempfile.mkdtemp(prefix="energon_suite_"))
    if args.torchvision_cpu_shim:
        (work / "shim").mkdir()
        (work / "shim" / "sitecustomize.py").write_text(TORCHVISION_CPU_SHIM)
        EXTRA_PATHS.insert(0, str(work / "shim"))
    ref_tests = copy_tests(args.energon_repo, work / "ref")
    our_tests = copy_tests(args.energon_repo, work / "ours")
    rewrite(our_tests)
    public = public_only_tests(ref_tests)
    extra: List[str] = []
    if args.k:
        extra += ["-k", args.k]
    only = public if args.only_public else set()
    ref = {} if args.skip_reference else run_pytest(ref_tests, work / "ref.xml", extra, args.timeout, only)
    ours = run_pytest(our_tests, work / "ours.xml", extra, args.timeout, only)

    def passed(results: Dict[str, Tuple[str, str]], ids: Set[str]) -> Set[str]:
        return {t for t in ids if results.get(t, ("", ""))[0] == "passed"}

    ran = set(ours) | set(ref)
    ref_pass = passed(ref, ran) if ref else set(ran)
    print(f"tests collected: {len(ran)}; use only public names: {len(ran & public)}")
    if ref:
        print(f"pass on Energon: {len(ref_pass)}; public-only among them: {len(ref_pass & public)}")
    ours_pass = passed(ours, ref_pass)
    print(f"pass on energon_ray (of those passing on Energon): {len(ours_pass)}; public-only: {len(ours_pass & public)}")
    print("\npublic-only tests failing on energon_ray:")
    for test in sorted((ref_pass & public) - ours_pass):
        outcome, message = ours.get(test, ("not run", ""))
        print(f"  {test}: {outcome}: {message}")
    print(f"\n(work folder: {work})")


if __name__ == "__main__":
    main()
