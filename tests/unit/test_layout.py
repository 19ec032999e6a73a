"""The package's shape as the README describes it: Ray is imported by three modules only, no
module-level import circles (a module's top-level ``energon_ray`` imports form a DAG), and modules
and functions of the house style's size (STYLE: a module under ~400 lines, a function under ~60)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[2] / "energon_ray"
RAY_MODULES = {"energon_ray.ray_env", "energon_ray.pipeline.build", "energon_ray.source.datasource"}
#: the house style's "~400" lines a module, with its slack (ray_env.py, Ray's boundary, is 408)
MODULE_LINES = 420
#: the house style's "~60" lines a function, its docstring not counted
FUNCTION_LINES = 60


def _modules() -> Dict[str, ast.Module]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def _imported(node: ast.AST) -> List[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def test_only_three_modules_import_ray():
    importing = {
        name for name, tree in _modules().items()
        if any(m == "ray" or m.startswith("ray.") for node in ast.walk(tree) for m in _imported(node))
    }  # fmt: skip
    assert importing == RAY_MODULES


def test_no_module_level_import_cycles():
    modules = _modules()
    graph: Dict[str, Set[str]] = {}
    for name, tree in modules.items():
        deps = set()
        for node in tree.body:  # top level only: imports inside functions run later, on purpose
            if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks never run
                continue
            for m in _imported(node):
                if m in modules and m != name:
                    deps.add(m)
        graph[name] = deps
    # a package's __init__ importing its own submodules is how packages work; not a circle
    state: Dict[str, int] = {}
    cycles: List[List[str]] = []

    def visit(node: str, stack: List[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if node.startswith(dep + "."):
                continue  # a submodule importing its package: runs the package first, by design
            if state.get(dep) == 1:
                cycles.append(stack[stack.index(dep):] + [dep] if dep in stack else [node, dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def _run_fresh(code: str) -> str:
    """What ``code`` prints, run by a fresh interpreter (which must succeed)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_feeders_module_imports_neither_torch_nor_ray_data():
    """The feeder actor's process imports ``energon_ray.pipeline.build``: it must start without
    torch (seconds of a cold first batch), and the training process without Ray Data."""
    code = "import sys, energon_ray.pipeline.build; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'PIL', 'av'}), 'ray.data' in sys.modules)"
    assert _run_fresh(code).split() == ["[]", "False"]


def test_task_imports_ignore_an_interrupt_that_lands_inside_import_torch():
    """Ray cancels a running task by interrupting its main thread; inside ``import torch`` that left a
    worker that could never import torch again. ``import_task_modules`` must finish the imports and
    put the SIGINT handler back (here the interrupt is raised from inside the torch import)."""
    code = (
        "import _thread, importlib.abc, signal, sys, time\n"
        "from energon_ray.ray_env import import_task_modules\n"
        "class Interrupt(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'torch':\n"
        "            _thread.interrupt_main()\n"
        "            time.sleep(0.05)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "before = signal.getsignal(signal.SIGINT)\n"
        "import_task_modules()\n"
        "print('torch' in sys.modules, 'energon_ray.pipeline.batch_stages' in sys.modules, signal.getsignal(signal.SIGINT) is before)\n"
    )
    assert _run_fresh(code).split() == ["True", "True", "True"]


def test_image_decoding_in_a_worker_does_not_load_pyav():
    """PyAV (FFmpeg's libraries, ~16 MiB and ~80 ms per process) is loaded at the first audio or
    video part: a Ray worker's task modules and an image decode leave it out, an mp4 part brings it."""
    code = (
        "import sys\n"
        "from energon_ray.ray_env import import_task_modules\n"
        "from energon_ray.decode.sample_decoder import SampleDecoder\n"
        "from energon_ray.synthetic import encode_image, sample_image\n"
        "import_task_modules()\n"
        "decoder = SampleDecoder()\n"
        "image = decoder.decode_part('jpg', encode_image(sample_image(0), 'JPEG'))\n"
        "print(tuple(image.shape), 'av' in sys.modules)\n"
        "video = decoder.decode_part('mp4', b'not a video')\n"
        "print(type(video).__name__, 'av' in sys.modules)\n"
    )
    assert _run_fresh(code).split("\n")[:2] == ["(3, 48, 64) False", "AVDecoder True"]


def test_modules_and_functions_stay_small():
    """A module over ``MODULE_LINES`` lines or a function whose code (docstring aside) is over
    ``FUNCTION_LINES`` lines is named: split it by concept (stop 60 split the five that had grown)."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(PACKAGE.parent)
        if len(text.splitlines()) > MODULE_LINES:
            too_long.append(f"{where}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) and len(body) > 1:
                body = body[1:]  # the docstring
            lines = body[-1].end_lineno - body[0].lineno + 1
            if lines > FUNCTION_LINES:
                too_long.append(f"{where}:{node.lineno} {node.name}: {lines} lines of code")
    assert too_long == []
