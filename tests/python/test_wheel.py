"""The built wheel, installed into a fresh virtual environment in a temporary directory, away from
the source tree: its libraries resolve inside that venv (oneDNN from the wheel, TVM from the apache-tvm
wheels), and a light model builds, runs, exports and loads through it, from Python and from the CLI.

scripts/test.sh builds the wheel once (scripts/wheel.sh) and points $TVM_HETERO_WHEEL at it; without
that variable the first test here builds it. Select these tests alone with ``pytest -m wheel``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
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
art, built = models.build_and_run(model, inputs)
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
    # C++ deploy: the public headers and the CMake package, and no source file.
    headers = sorted(p.name for p in (REPO / "include" / "tvm_hetero").rglob("*.h"))
    assert sorted(Path(n).name for n in names if n.startswith("tvm_hetero/include/tvm_hetero/") and n.endswith(".h")) == headers
    assert "tvm_hetero/share/cmake/tvm_hetero/tvm_heteroConfig.cmake" in names
    assert "tvm_hetero/share/cmake/tvm_hetero/tvm_heteroConfigVersion.cmake" in names
    assert not [name for name in names if name.endswith((".cc", "CMakeLists.txt", ".cmake.in"))]
    assert not [name for name in names if name.endswith(".h") and not name.startswith("tvm_hetero/include/")]


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


# ---- a bare machine: no C compiler, no linker ---------------------------------------------------
# A minimal Debian 12 (debootstrap minbase + python3, python3-venv), cached like the board's root. The
# wheel and its dependencies are downloaded here with pip and installed offline inside it (chroot).
BARE_DIR = Path(os.environ.get("TVM_HETERO_BARE_DIR", Path.home() / ".cache" / "tvm-hetero" / "bare"))
BARE_PACKAGES = "python3,python3-venv"
#: Installed beside the wheel in the root: onnx for `tvm-hetero compile` of an ONNX file.
BARE_EXTRA_REQUIREMENTS = ["onnx==1.23.2"]
#: What must not exist in the root (the reason for the test).
TOOLS_A_BARE_MACHINE_LACKS = ("gcc", "g++", "cc", "c++", "clang", "ld", "ld.bfd", "ld.gold", "as")

# Runs in the bare root with its python3 venv; prints one JSON line.
IN_BARE_ROOT = """
import json, sys, time
from pathlib import Path
import numpy as np
import tvm, tvm_hetero
from tvm_hetero import toolchain
from tvm_hetero.testing import models

work = Path(sys.argv[1])
found = {"linker": toolchain.linker().describe()}
mod, params = models.mlp()
art = tvm_hetero.build(mod, [(tvm.cpu(0), "llvm"), (tvm.cpu(1), "llvm")], placement={"matmul": 1}, params=params)
start = time.perf_counter()
art.export(work / "mlp")  # the first link prepares zig's C library stubs
found["first_export_seconds"] = time.perf_counter() - start
x = (np.arange(64) % 17 / 17.0 - 0.5).astype("float32").reshape(4, 16)  # examples/run_artifact.cc's ramp
expected = np.maximum(x @ params["w1"] + params["b1"], 0) @ params["w2"]
with tvm_hetero.load(work / "mlp").create() as rt:
    rt.run(x=x)
    loaded = rt.get_output(0).numpy()
found["mlp_vs_numpy"] = float(np.abs(loaded - expected).max() / np.abs(expected).max())
(work / "mlp" / "expected_sum.txt").write_text(f"{float(loaded.astype('float64').sum()):.6f}\\n")

cnn, cnn_params = models.small_cnn()
art = tvm_hetero.build(cnn, [(tvm.cpu(0), "llvm")], params=cnn_params, backends=["dnnl"])
found["dnnl_regions"] = sum(n for _b, _d, n, _ops in art.build_report.backend_regions)
image = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype("float32")
with art.create() as rt:
    rt.run(x=image)
    built = rt.get_output(0).numpy()
start = time.perf_counter()
art.export(work / "cnn")
found["second_export_seconds"] = time.perf_counter() - start
tvm_hetero.load(work / "cnn").export(work / "cnn-again")  # re-export: the library file is copied
with tvm_hetero.load(work / "cnn-again").create() as rt:
    rt.run(x=image)
    found["cnn_reexported_equals_built"] = bool(np.array_equal(rt.get_output(0).numpy(), built))
print(json.dumps(found))
"""

# Runs in the bare root after `tvm-hetero compile`: the compiled ONNX model against numpy.
CHECK_COMPILED_ONNX = """
import json, sys
import numpy as np
import tvm_hetero
w = np.load(sys.argv[2])
x = np.linspace(-1, 1, 4 * 16, dtype="float32").reshape(4, 16)
with tvm_hetero.load(sys.argv[1]).create() as rt:
    rt.run(x=x)
    got = rt.get_output(0).numpy()
expected = np.maximum(x @ w, 0)
print(json.dumps({"onnx_vs_numpy": float(np.abs(got - expected).max() / np.abs(expected).max())}))
"""


def bare_env(home: str = "/root") -> dict[str, str]:
    """What a login shell in the root would have: no $CXX, $CC or anything of this machine. Each run gets
    a fresh ``home`` (zig's cache lives there), so every run pays a first user's first link."""
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": home,
            "LANG": "C.UTF-8"}


def in_root(root: Path, cmd: list[str], timeout: float = 900, home: str = "/root") -> subprocess.CompletedProcess:
    """``cmd`` run by chroot inside ``root``; a failure shows its output."""
    result = subprocess.run(["chroot", str(root), *cmd], check=False, env=bare_env(home), capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, f"in {root}: {' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def bare_root() -> Path:
    """The cached minimal Debian 12 root (made by debootstrap the first time: minutes)."""
    if os.geteuid() != 0:
        pytest.skip("the bare-machine test needs root (debootstrap, chroot, mount); CI's wheel step runs as root")
    root = BARE_DIR / "root"
    marker = root / ".tvm-hetero-root"
    if (marker.read_text() if marker.exists() else None) != BARE_PACKAGES:
        partial = BARE_DIR / "root.partial"
        subprocess.run(["umount", str(root / "proc")], check=False, capture_output=True)  # a run killed midway
        subprocess.run(["rm", "-rf", "--one-file-system", str(partial), str(root)], check=True)
        BARE_DIR.mkdir(parents=True, exist_ok=True)
        if shutil.which("debootstrap") is None:
            run(["apt-get", "update", "-qq"], cwd=BARE_DIR)
            run(["apt-get", "install", "-y", "-qq", "debootstrap"], cwd=BARE_DIR)
        run(["debootstrap", "--variant=minbase", f"--include={BARE_PACKAGES}", "bookworm", str(partial),
             "http://deb.debian.org/debian"], cwd=BARE_DIR, timeout=1800)
        partial.rename(root)
        marker.write_text(BARE_PACKAGES)
    return root


def test_the_bare_root_has_no_compiler_and_no_linker(bare_root: Path) -> None:
    found = subprocess.run(["chroot", str(bare_root), "/bin/sh", "-c",
                            " ; ".join(f"command -v {tool}" for tool in TOOLS_A_BARE_MACHINE_LACKS) + " ; true"],
                           check=True, env=bare_env(), capture_output=True, text=True).stdout
    assert found.strip() == "", f"the bare root has {found.split()}"
    assert "Python 3.11" in in_root(bare_root, ["python3", "--version"]).stdout  # the host downloads for 3.11


@pytest.fixture(scope="module")
def bare_install(wheel: Path, bare_root: Path) -> Path:
    """A venv inside the bare root (its path there returned) with the wheel installed offline; /proc is
    mounted for the tests' duration (zig finds its own files through /proc/self/exe)."""
    wheels = BARE_DIR / "wheels"  # pip download skips what is already there
    run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
         "-d", str(wheels), str(wheel), *BARE_EXTRA_REQUIREMENTS], cwd=REPO, timeout=1800)
    for stale in wheels.glob("tvm_hetero-*.whl"):  # the cache keeps the dependencies only
        stale.unlink()
    inside = Path("/tmp") / f"tvm-hetero-wheel-{os.getpid()}"
    work = bare_root / inside.relative_to("/")
    (work / "wheels").mkdir(parents=True)
    for file in [*wheels.glob("*.whl"), wheel]:
        try:  # the cache and the root share a file system: a link, not a 300 MB copy
            os.link(file, work / "wheels" / file.name)
        except OSError:
            shutil.copyfile(file, work / "wheels" / file.name)
    subprocess.run(["mount", "-t", "proc", "proc", str(bare_root / "proc")], check=True)
    try:
        in_root(bare_root, ["python3", "-m", "venv", str(inside / "venv")], home=str(inside))
        in_root(bare_root, [str(inside / "venv" / "bin" / "pip"), "install", "-q", "--no-index", "--find-links",
                            str(inside / "wheels"), f"{inside / 'wheels' / wheel.name}", *BARE_EXTRA_REQUIREMENTS],
                home=str(inside))
        yield inside
    finally:
        subprocess.run(["umount", str(bare_root / "proc")], check=False)
        subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)


@pytest.fixture(scope="module")
def on_the_bare_machine(bare_root: Path, bare_install: Path) -> dict:
    """IN_BARE_ROOT's findings (its artifacts stay in the root's work folder until the module ends)."""
    (bare_root / bare_install.relative_to("/") / "bare.py").write_text(IN_BARE_ROOT)
    result = in_root(bare_root, [str(bare_install / "venv" / "bin" / "python"), str(bare_install / "bare.py"),
                                 str(bare_install)], home=str(bare_install))
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_on_a_machine_without_a_compiler_the_wheel_builds_exports_loads_and_runs(on_the_bare_machine: dict) -> None:
    got = on_the_bare_machine
    print(got)  # the first export (zig's first link) and a later one, timed: `pytest -m wheel -s`
    assert got["linker"].endswith("(from ziglang)") and " cc -target x86_64-linux-gnu" in got["linker"], got
    assert got["mlp_vs_numpy"] < 1e-5, got
    assert got["dnnl_regions"] >= 1, got  # the oneDNN region objects were linked too
    assert got["cnn_reexported_equals_built"], got


def test_tvm_hetero_compile_of_an_onnx_file_on_the_bare_machine(bare_root: Path, bare_install: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(5).standard_normal((16, 8)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "mm_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 8])], [numpy_helper.from_array(w, "w")])
    work = bare_root / bare_install.relative_to("/")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), work / "mm_relu.onnx")
    np.save(work / "w.npy", w)
    (work / "check_onnx.py").write_text(CHECK_COMPILED_ONNX)
    bin_dir = bare_install / "venv" / "bin"
    compiled = in_root(bare_root, [str(bin_dir / "tvm-hetero"), "compile", str(bare_install / "mm_relu.onnx"),
                                   "-o", str(bare_install / "onnx-out")], home=str(bare_install))
    assert "wrote" in compiled.stdout, compiled.stdout
    checked = in_root(bare_root, [str(bin_dir / "python"), str(bare_install / "check_onnx.py"),
                                  str(bare_install / "onnx-out"), str(bare_install / "w.npy")],
                      home=str(bare_install))
    assert json.loads(checked.stdout.strip().splitlines()[-1])["onnx_vs_numpy"] < 1e-5


# ---- C++ deploy against the installed wheel ------------------------------------------------------


def test_run_artifact_builds_against_the_installed_wheel_and_matches_python(
    venv: Path, bare_root: Path, bare_install: Path, on_the_bare_machine: dict, tmp_path: Path
) -> None:
    """examples/run_artifact.cc, copied away from the source tree with examples/CMakeLists.txt, finds
    the wheel's CMake package and runs the MLP the bare machine exported (linked by zig there): its
    output's sum matches the one Python computed there for the same ramp input."""
    cmake_dir = run([str(venv / "bin" / "python"), "-m", "tvm_hetero.config", "--cmakedir"], cwd=tmp_path).stdout.strip()
    assert site_packages(venv) in Path(cmake_dir).parents, cmake_dir
    source = tmp_path / "src"
    source.mkdir()
    for file in (REPO / "examples").iterdir():  # the examples' C++ half, as a user copies it
        if file.suffix in (".cc", ".h") or file.name == "CMakeLists.txt":
            shutil.copyfile(file, source / file.name)
    run(["cmake", "-S", str(source), "-B", str(tmp_path / "build"), f"-Dtvm_hetero_DIR={cmake_dir}"], cwd=tmp_path)
    run(["cmake", "--build", str(tmp_path / "build"), "--target", "run_artifact"], cwd=tmp_path, timeout=900)
    artifact = bare_root / bare_install.relative_to("/") / "mlp"
    ran = run([str(tmp_path / "build" / "run_artifact"), str(artifact), "--expect-sum",
               str(artifact / "expected_sum.txt"), "cpu:0", "cpu:1"], cwd=tmp_path).stdout
    assert "output 0: 32 values, sum" in ran, ran
    libraries = run(["ldd", str(tmp_path / "build" / "run_artifact")], cwd=tmp_path).stdout
    assert str(site_packages(venv) / "tvm_hetero" / "lib" / "libtvm_hetero.so") in libraries, libraries
