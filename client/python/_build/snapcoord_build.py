"""An in-tree PEP 517 build backend for the snapcoord package.

These machines reach no Python package index, so ``pip install
./client/python`` must not need one: pip builds in an isolated environment
and would fetch setuptools into it. The package is pure Python, so this
backend writes its wheel (and sdist) with the standard library alone and
declares no build requirements.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import os
import tarfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_TAG = "py3-none-any"


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    project["version"] = _version()
    return project


def _version() -> str:
    """snapcoord.__version__, read without importing the package (which
    needs grpc): the one assignment in snapcoord/_version.py."""
    tree = ast.parse((ROOT / "snapcoord" / "_version.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]:
            return ast.literal_eval(node.value)
    raise ValueError("snapcoord/_version.py assigns no __version__")


def _metadata() -> str:
    p = _project()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p['description']}",
        f"Requires-Python: {p['requires-python']}",
        *(f"Requires-Dist: {d}" for d in p.get("dependencies", [])),
        "Description-Content-Type: text/markdown",
        "",
        (ROOT / p["readme"]).read_text(encoding="utf-8"),
    ]
    return "\n".join(lines)


def _package_files() -> list[Path]:
    """Every .py file, type stub (.pyi) and py.typed marker of the package, in
    a stable order. Only snapcoord: the wheel installs no other top-level
    name (the generated buf.validate code is vendored inside it)."""
    return [
        path
        for path in sorted((ROOT / "snapcoord").rglob("*"))
        if path.is_file() and (path.suffix in (".py", ".pyi") or path.name == "py.typed") and "__pycache__" not in path.parts
    ]


def _dist_info() -> str:
    p = _project()
    return f"{p['name']}-{p['version']}.dist-info"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings=None) -> list[str]:
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    p = _project()
    name = f"{p['name']}-{p['version']}-{_TAG}.whl"
    info = _dist_info()
    entries = [(str(f.relative_to(ROOT)), f.read_bytes()) for f in _package_files()]
    entries.append((f"{info}/METADATA", _metadata().encode()))
    entries.append((f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: snapcoord_build\nRoot-Is-Purelib: true\nTag: {_TAG}\n".encode()))
    record = [_record_line(n, d) for n, d in entries] + [f"{info}/RECORD,,"]
    entries.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as whl:
        for n, d in entries:
            whl.writestr(zipfile.ZipInfo(n, date_time=(1980, 1, 1, 0, 0, 0)), d)
    return name


def build_sdist(sdist_directory, config_settings=None) -> str:
    p = _project()
    base = f"{p['name']}-{p['version']}"
    files = _package_files() + [ROOT / "pyproject.toml", ROOT / "README.md", Path(__file__)]
    with tarfile.open(os.path.join(sdist_directory, base + ".tar.gz"), "w:gz") as tar:
        for f in files:
            tar.add(f, arcname=f"{base}/{f.relative_to(ROOT)}")
        pkg_info = _metadata().encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(pkg_info)
        tar.addfile(ti, io.BytesIO(pkg_info))
    return base + ".tar.gz"
