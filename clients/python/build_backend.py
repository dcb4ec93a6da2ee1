"""A PEP 517 build backend for this package alone, with the standard
library: a wheel is a zip of codexec/ and its metadata. No build
requirement, so pip builds it offline (pyproject.toml names it)."""

import base64
import hashlib
import io
import os
import tarfile
import zipfile

NAME, VERSION = "codexec", "0.1.0"
HERE = os.path.dirname(os.path.abspath(__file__))
DIST_INFO = f"{NAME}-{VERSION}.dist-info"
TAG = "py3-none-any"


def _metadata():
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: Client for codexec: sandboxed, stateful code execution with versioned artifacts\n"
            "License: MIT\nRequires-Python: >=3.9\n"
            "Description-Content-Type: text/markdown\n\n" + readme)


def _package_files():
    pkg = os.path.join(HERE, NAME)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") or name == "py.typed":
            yield f"{NAME}/{name}", os.path.join(pkg, name)


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


get_requires_for_build_editable = get_requires_for_build_wheel


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, DIST_INFO)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    with open(os.path.join(d, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(f"Wheel-Version: 1.0\nGenerator: codexec build_backend\nRoot-Is-Purelib: true\nTag: {TAG}\n")
    return DIST_INFO


def _wheel(wheel_directory, files):
    name = f"{NAME}-{VERSION}-{TAG}.whl"
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        def add(arcname, data):
            z.writestr(arcname, data)
            records.append(_record_line(arcname, data))
        for arcname, data in files:
            add(arcname, data)
        add(f"{DIST_INFO}/METADATA", _metadata().encode())
        add(f"{DIST_INFO}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: codexec build_backend\n"
                                   f"Root-Is-Purelib: true\nTag: {TAG}\n").encode())
        records.append(f"{DIST_INFO}/RECORD,,")
        z.writestr(f"{DIST_INFO}/RECORD", "\n".join(records) + "\n")
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = []
    for arcname, path in _package_files():
        with open(path, "rb") as f:
            files.append((arcname, f.read()))
    return _wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """PEP 660: a .pth file that puts this directory on the path."""
    return _wheel(wheel_directory, [(f"_{NAME}_editable.pth", (HERE + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{VERSION}"
    name = f"{base}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "build_backend.py", "README.md"] + \
                [a for a, _ in _package_files()]:
            t.add(os.path.join(HERE, rel), arcname=f"{base}/{rel}")
        info = _metadata().encode()
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(info)
        t.addfile(ti, io.BytesIO(info))
    return name
