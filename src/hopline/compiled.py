"""The relay's hot path as compiled modules (mypyc), used only when built from exactly these sources.

``make`` compiles the modules of the per-frame path (``tools/compile_hot_path.py``: the decoder, the
relay, the bus, the journal's writer, the SSE stream) into ``build/compiled/``, beside a manifest
that holds a digest of every ``.py`` file of the package as it was compiled. At import, hopline
installs a finder for those modules only when that digest is the sources' digest now, and the
modules were built for this interpreter. Any edit to any module, and the compiled code is not
used until the next build: a stale build never runs, the source does (the same code, slower).

mypyc compiles the same source, so nothing here changes what hopline does: the whole test suite
runs on the compiled modules (``make test`` builds them first). ``HOPLINE_COMPILED=0`` runs the
source alone. :data:`STATE` says which one runs, and why (the daemon logs it at startup and shows it
in ``/daemon/status``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

from hopline.budget.variables import COMPILED_ENV

ENV = COMPILED_ENV
MANIFEST = "manifest.json"
PACKAGE_ROOT = Path(__file__).resolve().parent
BUILD_DIR = PACKAGE_ROOT.parent.parent / "build" / "compiled"  # the checkout's build/compiled


@dataclasses.dataclass(frozen=True)
class CompiledState:
    """``state``: ``on`` (the compiled modules are used), ``off`` (``HOPLINE_COMPILED=0``),
    ``absent`` (no build, or none for this interpreter) or ``stale`` (the sources changed since)."""

    state: str
    modules: int = 0
    reason: str = ""

    def to_json(self) -> dict[str, object]:
        return {"state": self.state, "modules": self.modules, "reason": self.reason}


def source_digest(package_root: Path) -> str:
    """SHA-256 over every ``.py`` file of the package: its path and its bytes, in path order."""
    digest = hashlib.sha256()
    for path in sorted(package_root.rglob("*.py")):
        relative = path.relative_to(package_root).as_posix()
        if "__pycache__" in relative:
            continue
        data = path.read_bytes()
        digest.update(b"%d:%s\0%d:" % (len(relative), relative.encode(), len(data)))
        digest.update(data)
    return digest.hexdigest()


class CompiledFinder:
    """A ``sys.meta_path`` finder for the manifest's modules (and mypyc's shared runtime module):
    each name maps to its extension file; any other name is left to the next finder."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        file = self.files.get(name)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(name, file)


def load_manifest(build_dir: Path, package_root: Path) -> tuple[CompiledState, dict[str, Path]]:
    """What the build in ``build_dir`` offers for the sources in ``package_root``: the state, and
    the extension file of each module (empty unless the state is ``on``)."""
    try:
        manifest = json.loads((build_dir / MANIFEST).read_text())
    except FileNotFoundError:
        return CompiledState("absent", reason="not built (make builds it)"), {}
    except (OSError, ValueError) as exc:
        return CompiledState("absent", reason=f"unreadable manifest ({type(exc).__name__})"), {}
    if manifest.get("suffix") != importlib.machinery.EXTENSION_SUFFIXES[0]:
        return CompiledState("absent", reason="built for another interpreter"), {}
    files = {name: build_dir / rel for name, rel in {**manifest.get("modules", {}),
                                                      **manifest.get("runtime", {})}.items()}
    if not manifest.get("modules"):
        return CompiledState("absent", reason=str(manifest.get("why", "nothing compiled"))), {}
    if manifest.get("digest") != source_digest(package_root):
        return CompiledState("stale", reason="the sources changed since the build (make rebuilds it)"), {}
    if not all(file.is_file() for file in files.values()):
        return CompiledState("absent", reason="a compiled module is missing"), {}
    return CompiledState("on", modules=len(manifest["modules"])), files


def install(build_dir: Path = BUILD_DIR, package_root: Path = PACKAGE_ROOT) -> CompiledState:
    """Put the finder first on ``sys.meta_path`` when the build matches; return the state."""
    value = os.environ.get(ENV, "1")
    if value != "1":  # anything but 1 (the default) or 0 is said, not guessed at
        return CompiledState("off", reason=f"{ENV}=0" if value == "0" else f"{ENV} is {value!r}, not 0 or 1")
    state, files = load_manifest(build_dir, package_root)
    if state.state == "on":
        sys.meta_path.insert(0, CompiledFinder(files))
    return state


STATE = install()
