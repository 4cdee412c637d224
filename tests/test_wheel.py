"""specviz installs from a wheel and runs outside the checkout: the wheel built from this tree carries every file the
package has (the C++ sources and their headers, the bench's data, the shipped drafters' weights), and once installed
in a fresh virtual environment, `specviz generate` runs from another folder on the installed copy alone."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from specviz import models, paths
from specviz.kernels import extension

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """`pip wheel` of the tree as it stands, built from a copy so that the checkout gets no build folder."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "specviz", source / "specviz", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(out),
                    str(source)], check=True, timeout=300)
    return next(out.glob("specviz-*.whl"))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed. Its dependencies (torch, transformers, ...) come from this
    environment's site-packages, named in a .pth file as a bare path: it follows the venv's own packages, and this
    environment's .pth files (the editable install of the checkout among them) are not run there."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "specviz-test-dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(wheel)], check=True,
                   timeout=300)
    return venv


def outside(command: list, cwd: Path, **env) -> subprocess.CompletedProcess:
    """A command run from `cwd` with nothing pointing at the checkout."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | env
    return subprocess.run([str(c) for c in command], cwd=cwd, env=environment, capture_output=True, text=True,
                          timeout=300)


def test_the_wheel_carries_every_file_of_the_package(wheel):
    tracked = subprocess.run(["git", "ls-files", "specviz"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout: no list of the package's files")
    names = set(zipfile.ZipFile(wheel).namelist())
    files = set()
    for path in tracked.stdout.split():  # specviz/assets links to assets/: the wheel holds that folder's files
        link = ROOT / path
        if link.is_symlink() and link.is_dir():
            inside = subprocess.run(["git", "ls-files", str(link.resolve().relative_to(ROOT))], cwd=ROOT,
                                    capture_output=True, text=True, check=True).stdout.split()
            files |= {path + f[len(str(link.resolve().relative_to(ROOT))):] for f in inside}
        else:
            files.add(path)
    missing = sorted(files - names)
    assert not missing, missing
    assert {"specviz/kernels/csrc/ops.h", "specviz/assets/eagle3-smollm2-135m/model.safetensors"} <= names


def test_the_installed_copy_is_the_one_imported_and_finds_its_package_data(venv, tmp_path):
    probe = ("import json, specviz, specviz.paths\n"
             "from specviz.kernels import extension\n"
             "print(json.dumps({'module': specviz.__file__, 'assets': str(specviz.paths.ASSETS),\n"
             "                  'library': str(extension.library_folder())}))")
    ran = outside([venv / "bin" / "python", "-c", probe], tmp_path)
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout)
    installed = Path(found["module"]).resolve()
    assert installed.is_relative_to(venv.resolve()) and not installed.is_relative_to(ROOT), installed
    assets = Path(found["assets"])
    assert assets.is_relative_to(venv.resolve())
    assert {p.parent.name for p in assets.glob("*/model.safetensors")} == {p.parent.name for p in paths.ASSETS.glob("*/model.safetensors")}
    # the C++ op's library is named by every file of csrc/: the same name means the same sources and headers
    assert found["library"] == str(extension.library_folder())


@pytest.mark.skipif(not models.is_fetched("smollm2-135m"), reason="smollm2-135m is not fetched (make fetch)")
def test_specviz_generate_runs_from_the_installed_copy(venv, tmp_path):
    """The EAGLE-3 drafter needs its shipped head: a wheel without its weights would fail here. (A fixed tree size
    and draft length: `auto` or the cost-aware length would time the verify-cost curve first, and could draft
    nothing on a busy host.)"""
    built = (extension.library_folder() / f"{extension.LIBRARY}.so").is_file()
    ran = outside([venv / "bin" / "specviz", "generate", "--prompt", "Name three colours.", "--drafter", "eagle3:total_tokens=8:k_policy=fixed",
                   "--max-new-tokens", "6", "--weights", "fp32", "--json"], tmp_path,
                  SPECVIZ_EXTENSION="1" if built else "0")  # not compiled here: the checkout's build is reused
    assert ran.returncode == 0, ran.stderr[-3000:]
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["text"] and 1 <= len(result["token_ids"]) <= 6
    assert result["stats"]["drafted"] > 0  # the head proposed tokens
