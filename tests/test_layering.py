"""The layering of DESIGN.md: the core imports neither mlflow nor optuna, and only
``asyncrlhf/distributed`` imports ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "asyncrlhf"


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_only_the_distributed_package_imports_ray_and_nothing_imports_mlflow_or_optuna():
    for path in CORE.rglob("*.py"):
        roots = imported_roots(path)
        assert not roots & {"mlflow", "optuna", "pipelines"}, path
        if "distributed" not in path.parts:
            assert "ray" not in roots, path


def test_importing_the_core_loads_no_optional_dependency():
    code = (
        "import sys, asyncrlhf, asyncrlhf.rewards, asyncrlhf.losses, asyncrlhf.buffers, asyncrlhf.tasks, "
        "asyncrlhf.rollout, asyncrlhf.training, asyncrlhf.orchestration, asyncrlhf.models\n"
        "print(sorted({'ray', 'mlflow', 'optuna', 'vllm'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_weights_group_imports_without_ray():
    """A GPU machine without Ray runs the NCCL weights test: ``asyncrlhf.distributed``
    imports its Ray-backed names only when they are used."""
    code = (
        "import sys; sys.modules['ray'] = None\n"  # any import of ray fails
        "from asyncrlhf.distributed.weights import WeightChannel\n"
        "import asyncrlhf.distributed as d\n"
        "try:\n    d.RayOrchestrator\nexcept ImportError:\n    print('ray needed')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ray needed"


PIPELINES = Path(__file__).resolve().parents[1] / "pipelines"
FLOORS = ["spec", "tracking", "run", "sweeps", "bench", "cli"]  # each may import only those before it


def test_no_pipelines_subpackage_imports_one_above_it():
    upward = []
    for path in PIPELINES.rglob("*.py"):
        floor = path.relative_to(PIPELINES).parts[0]
        if floor not in FLOORS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            modules += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for module in modules:
                parts = [*module.split("."), ""]
                if parts[0] == "pipelines" and parts[1] in FLOORS and FLOORS.index(parts[1]) > FLOORS.index(floor):
                    upward.append(f"{path.relative_to(PIPELINES)}:{node.lineno} imports {module}")
    assert upward == []
    assert sorted(p.name for p in PIPELINES.iterdir() if p.suffix == ".py") == ["__init__.py"]  # no loose modules
