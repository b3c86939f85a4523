"""Building without oneDNN is a choice the user makes and sees: CMake stops unless it is asked for,
and a library built without it says so (``__version__``, ``tvm-hetero --version``; the build report:
test_byoc.py) with what it costs. The library's own build facts are read from it, not from the source tree."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tvm_hetero
from tvm_hetero import cli
from tvm_hetero.backends import dnnl
from tvm_hetero.build_info import BuildInfo, built_with

REPO = Path(__file__).resolve().parents[2]
# Hides every system prefix from CMake's searches: oneDNN (libdnnl-dev, under /usr) is then "not installed".
NO_SYSTEM_PREFIXES = "-DCMAKE_IGNORE_PREFIX_PATH=/usr;/;/usr/local"


def configure(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    if shutil.which("cmake") is None or shutil.which("ninja") is None:
        pytest.skip("cmake and ninja are needed to configure")
    return subprocess.run(
        ["cmake", "-S", str(REPO), "-B", str(tmp_path / "build"), "-G", "Ninja",
         f"-DPython3_EXECUTABLE={sys.executable}", NO_SYSTEM_PREFIXES, *options],
        check=False, capture_output=True, text=True, timeout=300,
    )


def test_cmake_stops_without_onednn_and_names_the_package_and_the_way_to_build_without_it(tmp_path: Path) -> None:
    result = configure(tmp_path)
    message = " ".join(result.stderr.split())
    assert result.returncode != 0
    assert "oneDNN 2.x not found" in message and "libdnnl-dev" in message, message
    assert "-DTVM_HETERO_WITH_ONEDNN=OFF" in message and "TVM_HETERO_WITH_ONEDNN=OFF pip install" in message


def test_cmake_builds_without_onednn_when_asked_and_warns(tmp_path: Path) -> None:
    result = configure(tmp_path, "-DTVM_HETERO_WITH_ONEDNN=OFF")
    assert result.returncode == 0, result.stderr
    assert "the dnnl backend is not built in" in " ".join(result.stderr.split())


def no_onednn_build() -> BuildInfo:
    return BuildInfo(package="0.1.0", tvm="0.27.0.post1", onednn=None, backends=("qnn",), library=Path("x.so"))


def test_a_build_without_onednn_says_so_and_what_it_costs() -> None:
    info = no_onednn_build()
    assert info.version == "0.1.0+tvm0.27.0.post1.onednn.none"
    text = info.describe()
    assert "oneDNN: not built in" in text and "untuned TVM kernels" in text and "slower" in text
    assert "backends built in: qnn" in text


def test_version_names_the_loaded_library_s_build() -> None:
    info = built_with()
    assert tvm_hetero.__version__ == info.version
    assert f'version = "{info.package}"' in (REPO / "pyproject.toml").read_text()
    assert info.tvm == importlib.metadata.version("apache-tvm")
    assert info.library.is_file()
    if dnnl.info().get("available"):  # the headers compiled against and the library loaded agree
        assert info.onednn == dnnl.info()["version"] and "dnnl" in info.backends
    else:
        assert info.onednn is None and "dnnl" not in info.backends


def test_cli_version_prints_the_build_and_exits(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"tvm-hetero {built_with().package} ")
    assert f"TVM: apache-tvm {built_with().tvm}" in out
    assert ("oneDNN: not built in" in out) == (built_with().onednn is None)
