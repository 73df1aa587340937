"""`pip install ./client/python` works where no package index is reachable:
the in-tree build backend needs nothing but the standard library."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parent.parent


def test_pip_installs_the_package_without_an_index(tmp_path: pathlib.Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHONPATH"))}
    # An unreachable index: any fetch fails at once instead of hiding behind
    # a cache or a network that happens to be there.
    env.update(PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", str(PACKAGE)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    # Imported from the venv, not from the checkout, with its generated code.
    probe = "import snapcoord, snapcoord.nemo_rl, snapcoord.v1.run_pb2, buf.validate.validate_pb2; print(snapcoord.__file__)"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path, check=True)
    assert out.stdout.strip().startswith(str(venv)), out.stdout
    typed = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.resources as r; print(r.files('snapcoord').joinpath('py.typed').is_file())"],
                           env=env, capture_output=True, text=True, cwd=tmp_path, check=True)  # fmt: skip
    assert typed.stdout.strip() == "True"
