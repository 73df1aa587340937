"""`pip install ./client/python` works where no package index is reachable:
the in-tree build backend needs nothing but the standard library. The wheel
installs the package snapcoord and no other top-level name, with its type
stubs and the version snapcoord.__version__ says."""

from __future__ import annotations

import email.parser
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import snapcoord

PACKAGE = pathlib.Path(__file__).resolve().parent.parent


def offline_pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHONPATH"))}
    # An unreachable index: any fetch fails at once instead of hiding behind
    # a cache or a network that happens to be there.
    env.update(PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_NO_CACHE_DIR="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def test_pip_installs_the_package_without_an_index(tmp_path: pathlib.Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = offline_pip_env()
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", str(PACKAGE)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    # Imported from the venv, not from the checkout, with its generated code
    # and its version, which pip also recorded.
    probe = (
        "import importlib.metadata, snapcoord, snapcoord.nemo_rl, snapcoord.v1.run_pb2, snapcoord._vendor.buf.validate.validate_pb2; "
        "print(snapcoord.__file__, snapcoord.__version__, importlib.metadata.version('snapcoord'))"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path, check=True)
    where, version, recorded = out.stdout.split()
    assert where.startswith(str(venv)), out.stdout
    assert version == recorded == snapcoord.__version__
    typed = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.resources as r; print(r.files('snapcoord').joinpath('py.typed').is_file())"],
                           env=env, capture_output=True, text=True, cwd=tmp_path, check=True)  # fmt: skip
    assert typed.stdout.strip() == "True"

    # mypy (Debian's python3-mypy) passes on a user's loop against the
    # installed package, the generated messages typed by their stubs: a
    # field misspelled is caught.
    for example in ("toy_grpo.py", "env_worker.py"):
        shutil.copy(PACKAGE / "examples" / example, tmp_path / example)
    (tmp_path / "loop.py").write_text(USER_LOOP)
    mypy = [sys.executable, "-m", "mypy", "--python-executable", str(venv / "bin" / "python")]
    checked = subprocess.run([*mypy, "toy_grpo.py", "env_worker.py", "loop.py"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (tmp_path / "loop.py").write_text(USER_LOOP.replace("trainer_world_size", "trainer_world_sise"))
    checked = subprocess.run([*mypy, "loop.py"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert 'Unexpected keyword argument "trainer_world_sise" for "RunSpec"' in checked.stdout, checked.stdout + checked.stderr


USER_LOOP = """
import snapcoord
from snapcoord.v1 import run_pb2


def start(client: snapcoord.Client) -> str:
    _, token = client.create_run("run-a", run_pb2.RunSpec(trainer_world_size=2))
    seconds: float = client.get_run("run-a").deadline.iteration_seconds
    return f"{token} {seconds} {snapcoord.__version__}"
"""


def test_the_wheel_holds_snapcoord_alone(tmp_path: pathlib.Path) -> None:
    """No top-level name but snapcoord (and its dist-info): the vendored
    buf.validate code lives inside it, where it cannot collide with another
    package's `buf`. The stubs of the generated modules ship, for mypy."""
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(PACKAGE)],
                           env=offline_pip_env(), capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name == f"snapcoord-{snapcoord.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        metadata = email.parser.Parser().parsestr(whl.read(f"snapcoord-{snapcoord.__version__}.dist-info/METADATA").decode())
    assert {n.split("/", 1)[0] for n in names} == {"snapcoord", f"snapcoord-{snapcoord.__version__}.dist-info"}
    assert "snapcoord/_vendor/buf/validate/validate_pb2.py" in names
    assert {"snapcoord/py.typed", "snapcoord/v1/run_pb2.pyi", "snapcoord/_vendor/buf/validate/validate_pb2.pyi"} <= set(names)
    assert metadata["Version"] == snapcoord.__version__
    assert metadata["Requires-Python"] == ">=3.11"
