"""Is the code that judges a notebook the code that was installed? Hashes, taken before any student code runs.

A student's notebook runs with the grader's rights, so it can rewrite the installed
``flashcourse/checks/*.py``, ``exercise_checks.json`` or NumPy's own files, and every later grade on
that machine would then pass. :func:`Snapshot.take` reads the package's files once, before
anything of the student's runs: when the package was installed from a wheel, each file is verified
against the wheel's ``RECORD`` hashes (an editable install records none: its files are trusted as
found at the start of the grade). :func:`verify_dependencies` does the same for the ``.py`` files of
the libraries the checks compute with (NumPy, torch, Triton). After each step that ran student code,
:meth:`Snapshot.changed` says which package files differ, and :meth:`Snapshot.restore` writes the
original bytes back; the grade of that notebook is refused. The checks themselves run from
:meth:`Snapshot.write_copy`, a private copy of the verified bytes.

Example:
    >>> snap = Snapshot.take()
    >>> "checks/cases.py" in snap.files and snap.changed() == []
    True
"""
from __future__ import annotations

import base64
import hashlib
import site
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

__all__ = ["PACKAGE_DIR", "TamperedError", "Snapshot", "StartupFiles", "site_directories", "record_mismatches", "verify_dependencies",
           "DEPENDENCIES"]

PACKAGE_DIR = Path(__file__).resolve().parents[1]
#: The distributions whose Python files the checks run (their compiled libraries are not hashed).
DEPENDENCIES = ("numpy", "torch", "triton")


class TamperedError(RuntimeError):
    """Installed files differ from what was installed (or from what they were when the grade began)."""


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def _record_hash(data: bytes, mode: str) -> str:
    return base64.urlsafe_b64encode(hashlib.new(mode, data).digest()).rstrip(b"=").decode()


def record_mismatches(dist_name: str, suffixes=(".py", ".json")) -> tuple[list[str], int]:
    """(the files of installed distribution ``dist_name`` whose bytes differ from its ``RECORD`` hash
    or are missing, how many files were verified), over the files ending in ``suffixes``.

    Example:
        >>> bad, n = record_mismatches("numpy")
        >>> bad, n > 100
        ([], True)
    """
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        return [], 0
    bad, n = [], 0
    for f in dist.files or []:
        if f.hash is None or not str(f).endswith(tuple(suffixes)):
            continue
        path = Path(f.locate())
        n += 1
        try:
            if _record_hash(path.read_bytes(), f.hash.mode) != f.hash.value:
                bad.append(str(path))
        except OSError:
            bad.append(f"{path} (missing)")
    return bad, n


def verify_dependencies(names=DEPENDENCIES) -> None:
    """Raise :class:`TamperedError` naming the files of ``names`` that differ from their ``RECORD``.

    Example:
        >>> verify_dependencies(["numpy"])
    """
    bad = [f for name in names for f in record_mismatches(name)[0]]
    if bad:
        shown = "\n  ".join(bad[:10]) + (f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise TamperedError(f"installed files differ from what pip installed (reinstall them: "
                            f"pip install --force-reinstall {' '.join(names)}):\n  {shown}")


@dataclass
class Snapshot:
    """The package's files (relative path -> bytes) as they were before the grade ran student code,
    and how they were verified (``"RECORD"`` for a wheel install, ``"start of grade"`` otherwise)."""
    root: Path
    files: dict
    verified_by: str

    @classmethod
    def take(cls, root: Path | str = PACKAGE_DIR) -> "Snapshot":
        """Read the package at ``root``; raise :class:`TamperedError` if a wheel install differs from its RECORD.

        Example:
            >>> Snapshot.take().root.name
            'flashcourse'
        """
        root = Path(root).resolve()
        files = _files(root)
        verified_by = "start of grade"
        try:
            dist = metadata.distribution("flashcourse")
            hashed = {Path(f.locate()).resolve(): f.hash for f in dist.files or [] if f.hash is not None}
        except metadata.PackageNotFoundError:
            hashed = {}
        mine = {p: h for p, h in hashed.items() if root in p.parents}
        if mine:                                             # a wheel install: every file has a hash
            verified_by = "RECORD"
            bad = [p.relative_to(root).as_posix() for p, h in sorted(mine.items())
                   if p.relative_to(root).as_posix() not in files
                   or _record_hash(files[p.relative_to(root).as_posix()], h.mode) != h.value]
            extra = [r for r in files if r.endswith(".py") and (root / r).resolve() not in mine]
            if bad or extra:
                raise TamperedError(
                    f"the installed flashcourse package at {root} differs from its wheel's RECORD "
                    f"(changed: {', '.join(bad) or 'none'}; added: {', '.join(extra) or 'none'}): "
                    f"reinstall it with pip install --force-reinstall flashcourse before grading")
        return cls(root, files, verified_by)

    def changed(self) -> list[str]:
        """The files that differ now from the snapshot (changed, removed, or added), sorted.

        Example:
            >>> Snapshot.take().changed()
            []
        """
        now = _files(self.root)
        return sorted(r for r in set(now) | set(self.files) if now.get(r) != self.files.get(r))

    def restore(self) -> list[str]:
        """Write the snapshot's bytes back over the package (an added file is removed); returns what changed."""
        changed = self.changed()
        for rel in changed:
            path = self.root / rel
            if rel in self.files:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(self.files[rel])
            elif path.is_file():
                path.unlink()
        return changed

    def write_copy(self, parent: Path | str) -> Path:
        """Write the snapshot as ``parent/flashcourse`` (to import the package from); returns ``parent``."""
        parent = Path(parent)
        for rel, data in self.files.items():
            path = parent / "flashcourse" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return parent


def site_directories() -> list[Path]:
    """Every directory this Python installs packages in: its ``site-packages`` (``purelib``,
    ``platlib``), the system's and the user's site directories; resolved, sorted.

    Example:
        >>> any((d / "numpy").is_dir() for d in site_directories())
        True
    """
    dirs = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    try:
        dirs |= set(site.getsitepackages()) | {site.getusersitepackages()}
    except AttributeError:  # pragma: no cover - some old virtualenvs lack these
        pass
    return sorted({Path(d).resolve() for d in dirs})


class StartupFiles:
    """The files every normal Python start runs (``sitecustomize.py``, ``usercustomize.py`` and the
    ``*.pth`` files of the site directories), as they were when the grade began: a notebook that adds
    one would run its code in every later Python of the machine, the next grade's included.

    Example:
        >>> s = StartupFiles()
        >>> s.changed()
        []
    """

    def __init__(self):
        self.dirs = site_directories()
        self.files = self._read()

    def _read(self) -> dict:
        found = {}
        for d in self.dirs:
            if d.is_dir():
                for p in d.iterdir():
                    if p.is_file() and (p.suffix == ".pth" or p.name in ("sitecustomize.py", "usercustomize.py")):
                        found[str(p)] = p.read_bytes()
        return found

    def changed(self) -> list[str]:
        """The start-up files added, changed or removed since the grade began."""
        now = self._read()
        return sorted(p for p in set(now) | set(self.files) if now.get(p) != self.files.get(p))

    def restore(self) -> list[str]:
        """Put the start-up files back as they were (an added one is removed); returns what changed."""
        changed = self.changed()
        for p in changed:
            if p in self.files:
                Path(p).write_bytes(self.files[p])
            else:
                Path(p).unlink(missing_ok=True)
        return changed
