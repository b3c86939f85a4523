"""The built wheel, installed into a fresh virtual environment in a temporary directory, away from
the source tree: its libraries resolve inside that venv (oneDNN from the wheel, TVM from the apache-tvm
wheels), and a light model builds, runs, exports and loads through it, from Python and from the CLI.

scripts/test.sh builds the wheel once (scripts/wheel.sh) and points $TVM_HETERO_WHEEL at it; without
that variable the first test here builds it. Select these tests alone with ``pytest -m wheel``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.wheel

REPO = Path(__file__).resolve().parents[2]
MODEL = "squeezenet"  # a light model that is one oneDNN region: quick to build, oneDNN on its hot path

# Runs inside the fresh venv, from a directory outside the source tree; prints one JSON line.
IN_VENV = """
import json, sys
import numpy as np
import tvm, tvm_hetero
from tvm_hetero.backends import dnnl
from tvm_hetero.build_info import onednn_library
from tvm_hetero.testing import models

out_dir = sys.argv[1]
model = models.light_model({model!r})
inputs = models.model_inputs(model)
expected = models.onnxruntime_outputs(model, inputs)[0]
art = tvm_hetero.build(models.relax_module(model), [(tvm.cpu(0), "llvm")])
runtime = art.create()
runtime.run(**inputs)
built = runtime.get_output(0).numpy()
art.export(out_dir)
loaded = tvm_hetero.load(out_dir).create()
loaded.run(**inputs)
threads = []
for n in (1, 2):  # the library finds the wheel's own OpenMP at run time (dlsym)
    dnnl.set_num_threads(n)
    threads.append(dnnl.info()["threads"])
print(json.dumps({{
    "package_file": tvm_hetero.__file__,
    "version": tvm_hetero.__version__,
    "library": str(tvm_hetero.built_with().library),
    "onednn_library": str(onednn_library()),
    "dnnl_regions": sum(n for _b, _d, n, _ops in art.build_report.backend_regions),
    "built_vs_onnxruntime": float(np.abs(built - expected).max() / np.abs(expected).max()),
    "loaded_equals_built": bool(np.array_equal(loaded.get_output(0).numpy(), built)),
    "threads": threads,
}}))
"""


def clean_env() -> dict[str, str]:
    """The environment without anything that points into the source tree."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TVM_HETERO_LIBRARY", "VIRTUAL_ENV")}


def run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, check=False, cwd=cwd, env=clean_env(), capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def wheel() -> Path:
    """$TVM_HETERO_WHEEL, or the wheel scripts/wheel.sh builds now."""
    if os.environ.get("TVM_HETERO_WHEEL"):
        return Path(os.environ["TVM_HETERO_WHEEL"]).resolve()
    run([str(REPO / "scripts" / "wheel.sh")], cwd=REPO, timeout=1200)
    (built,) = (REPO / "dist").glob("tvm_hetero-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (outside the source tree) with the wheel and its ``models`` extra (onnx and
    onnxruntime, for the light model and its reference) installed by pip; pip's cache keeps the
    dependencies' downloads between runs."""
    place = tmp_path_factory.mktemp("wheel-install")
    assert REPO not in place.parents
    venv = place / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=place)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
         f"{wheel}[models]"], cwd=place)
    return venv


def site_packages(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return site


def test_wheel_holds_the_package_and_its_libraries_and_nothing_of_the_source_tree(wheel: Path) -> None:
    assert "manylinux" in wheel.name, wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names} - {"tvm_hetero", "tvm_hetero.libs"}
    assert len(tops) == 1 and tops.pop().endswith(".dist-info"), names
    assert "tvm_hetero/lib/libtvm_hetero.so" in names
    assert "tvm_hetero/cli.py" in names
    assert any(name.startswith("tvm_hetero.libs/libdnnl") for name in names)
    # TVM's own libraries come from the apache-tvm and apache-tvm-ffi wheels, never a second copy.
    assert not [name for name in names if Path(name).name.startswith("libtvm") and "hetero" not in name]
    assert not [name for name in names if name.endswith((".cc", ".h", ".cmake", "CMakeLists.txt"))]


def test_every_library_of_the_install_resolves_inside_the_venv_or_the_c_runtime(venv: Path) -> None:
    site = site_packages(venv)
    libraries = sorted(p for p in site.glob("tvm_hetero*/**/*.so*") if p.is_file())
    assert len(libraries) >= 2, libraries  # libtvm_hetero.so and the wheel's oneDNN at least
    for library in libraries:
        ldd = run(["ldd", str(library)], cwd=venv).stdout
        assert "not found" not in ldd, f"{library}:\n{ldd}"
        for line in ldd.splitlines():
            name, _, target = line.strip().partition(" => ")
            if name.startswith(("libdnnl", "libgomp", "libtvm")):
                resolved = Path(target.split(" (")[0]).resolve()
                assert site in resolved.parents, f"{library}: {name} resolves outside the venv: {resolved}"


@pytest.fixture(scope="module")
def through_the_wheel(venv: Path) -> tuple[dict, Path]:
    """IN_VENV's findings, and the artifact directory it exported."""
    work = venv.parent
    script = work / "through_the_wheel.py"
    script.write_text(IN_VENV.format(model=MODEL))
    result = run([str(venv / "bin" / "python"), str(script), str(work / "artifact")], cwd=work)
    return json.loads(result.stdout.strip().splitlines()[-1]), work / "artifact"


def test_a_light_model_builds_runs_exports_and_loads_from_the_installed_wheel(
    venv: Path, through_the_wheel: tuple[dict, Path]
) -> None:
    got, _artifact = through_the_wheel
    site = site_packages(venv)
    for key in ("package_file", "library", "onednn_library"):
        assert site in Path(got[key]).resolve().parents, f"{key}: {got[key]} is not from the installed wheel"
    assert "+tvm0.27.0.post1.onednn2." in got["version"], got["version"]
    assert got["dnnl_regions"] >= 1
    assert got["built_vs_onnxruntime"] < 1e-4
    assert got["loaded_equals_built"]
    assert got["threads"] == [1, 2]


def test_cli_of_the_installed_wheel_reports_its_build_and_runs_the_exported_model(
    venv: Path, through_the_wheel: tuple[dict, Path]
) -> None:
    _got, artifact = through_the_wheel
    cli = str(venv / "bin" / "tvm-hetero")
    version = run([cli, "--version"], cwd=venv.parent).stdout
    assert "TVM: apache-tvm 0.27.0.post1" in version
    assert "oneDNN: 2." in version and str(site_packages(venv)) in version, version
    assert "backends built in: dnnl" in version
    ran = run([cli, "run", str(artifact), "--repeat", "2"], cwd=venv.parent).stdout
    assert "output 0: shape (1, 1000, 1, 1) float32" in ran, ran  # SqueezeNet's logits
