"""Did a notebook change what the grade imports? Every file the verdict and the worker import, and every
folder on their import paths, checked against the moment the grade began; and what changed, put back.

A notebook runs with the grader's rights, unless the grader is root and runs it as a user of its own
(:mod:`.sandbox`): it can append to a library the verdict imports, put a module that shadows one of the
standard library's in a site directory, a new file in a package that imports whatever it finds there
(NumPy's ``_distributor_init_local``), or a compiled ``__pycache__`` file beside an unchanged source;
each made that grade, and every later one, pass. :class:`Installation` knows, before any student code
runs, the import roots (the standard library and the site directories) and the files of the modules
this process imported (the grader imports what the verdict imports: ``flashcourse.checks``), with the
bytes of their sources. A change leaves a mark no program of the user's can undo: a file's or a
folder's *ctime*, set by the kernel on every write, rename or link. :meth:`Installation.changes` lists
every imported file, every source's compiled file and every entry of a folder under the roots whose
ctime is not older than the grade's mark (:meth:`Installation.mark`), and every entry gone;
:meth:`Installation.restore` writes the sources back, compiles the compiled files again, deletes what
was not there when it was taken (it lists the roots' entries then), and names what it could not put
back (a changed library file it had no copy of). Nothing that was there is ever deleted.

Example:
    >>> inst = Installation.current()
    >>> since = inst.mark()
    >>> inst.changes(since)
    []
"""
from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

__all__ = ["Installation", "import_roots"]


def import_roots() -> list[Path]:
    """The folders the verdict and the worker import from: the standard library (its ``site-packages`` and
    ``test`` left out: never on their path) with ``lib-dynload``, and the site directories.

    Example:
        >>> any((d / "json").is_dir() for d in import_roots())
        True
    """
    from .worker import site_dirs
    paths = sysconfig.get_paths()
    roots = [Path(paths["stdlib"]), Path(paths["platstdlib"])] + [Path(d) for d in site_dirs()]
    return list(dict.fromkeys(p.resolve() for p in roots if p.is_dir()))


def _skipped(root: Path) -> set:
    return {root / "site-packages", root / "test", root / "idlelib", root / "tkinter", root / "turtledemo"}


class Installation:
    """The import roots and the imported files of this Python, as they were when it was taken (see the
    module's docstring); one per process (:meth:`current`)."""

    _current = None

    def __init__(self, roots=None, keep=()):
        """``roots`` and ``keep`` (files whose bytes to keep besides the imported modules') are for tests."""
        if roots is None:
            import flashcourse.checks  # noqa: F401  (the verdict's modules: their files are the ones to keep)
            from .integrity import verify_dependencies
            from .serve import python_of  # noqa: F401  (and the worker's)
            verify_dependencies()      # NumPy's, torch's and Triton's files as pip installed them
        self.roots = import_roots() if roots is None else [Path(r).resolve() for r in roots]
        # each root as a string, and the prefix of the paths under it (under_roots: a string test, Path.parents is slow)
        self._prefixes = [(str(r), str(r) if str(r).endswith(os.sep) else str(r) + os.sep) for r in self.roots]
        self.files = set()
        self.sources = {os.path.realpath(p): Path(p).read_bytes() for p in keep}
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None)
            if isinstance(path, str) and self.under_roots(path):
                self.files.add(os.path.realpath(path))
                cached = getattr(module, "__cached__", None)
                if cached:
                    self.files.add(os.path.realpath(cached))
                if path.endswith(".py"):
                    try:
                        self.sources[os.path.realpath(path)] = Path(path).read_bytes()
                    except OSError:
                        pass
        self.files = set(self.files) | set(self.sources)
        self.mtimes = {p: os.stat(p).st_mtime_ns for p in self.sources}
        for p in self.sources:            # a stale compiled file would be written again by the next Python: now, then
            self._fresh(p)
        self.files |= {importlib.util.cache_from_source(p) for p in self.sources}     # what Python would read instead
        self.files |= {os.path.realpath(sys.executable), os.path.abspath(sys.executable),
                       os.path.join(sys.prefix, "pyvenv.cfg")}
        self.listed = {folder: {e.name for e in entries} for root in self.roots for folder, entries in self._walk(root)}
        self.existing = {os.path.join(folder, name) for folder, names in self.listed.items() for name in names}
        self.broken: list[str] = []

    @classmethod
    def current(cls) -> "Installation":
        """This process's :class:`Installation`, taken the first time it is asked for (before any grade ran)."""
        if cls._current is None:
            cls._current = cls()
        return cls._current

    def under_roots(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(real == r or real.startswith(prefix) for r, prefix in self._prefixes)

    def mark(self) -> int:
        """A moment to compare with: the ctime of a file made now (the kernel's own clock, as every file's), once
        that clock has moved on from what was written before (it ticks in milliseconds: the grader's own writes,
        a put-back, must be older than the mark)."""
        def ctime():
            fd, path = tempfile.mkstemp(prefix="flashcourse-mark-")
            try:
                return os.fstat(fd).st_ctime_ns
            finally:
                os.close(fd)
                os.unlink(path)
        before = ctime()
        while (now := ctime()) <= before:
            time.sleep(0.001)
        return now

    def changes(self, since: int, modules=(), libraries=()) -> list[str]:
        """Every path under the roots changed (written, renamed, linked, made) since ``since``: the files this
        process imported, another's (the verdict's ``modules`` and shared ``libraries``), and the entries of every
        folder that changed, made or gone (a folder that was there is not one itself: its entries are); sorted. A
        module imported from outside the roots is one too."""
        found = {p for p in modules if os.path.isabs(p) and not self.under_roots(p)}
        others = [os.path.realpath(p) for p in list(modules) + list(libraries) if os.path.isabs(p) and self.under_roots(p)]
        for path in list(self.files) + others:
            try:
                if os.lstat(path).st_ctime_ns >= since:
                    found.add(path)
            except FileNotFoundError:
                if path in self.sources:
                    found.add(path)
            except OSError:
                pass
        for root in self.roots:
            for folder, entries in self._walk(root):
                try:
                    if os.lstat(folder).st_ctime_ns < since:
                        continue
                except OSError:
                    continue
                for entry in entries:
                    try:
                        fresh = entry.stat(follow_symlinks=False).st_ctime_ns >= since
                    except OSError:
                        continue
                    if fresh and not (entry.path in self.existing and entry.is_dir(follow_symlinks=False)):
                        found.add(entry.path)
                found |= {os.path.join(folder, n) for n in self.listed.get(folder, ())
                          if not os.path.lexists(os.path.join(folder, n))}
        return sorted(found)

    def _walk(self, root: Path):
        """(folder, its entries) for every folder under ``root``, the standard library's unused parts left out."""
        todo, skipped = [str(root)], {str(p) for p in _skipped(root)}
        while todo:
            folder = todo.pop()
            try:
                with os.scandir(folder) as it:
                    entries = [e for e in it if e.path not in skipped]
            except OSError:
                continue
            todo += [e.path for e in entries if e.is_dir(follow_symlinks=False)]
            yield folder, entries

    def restore(self, changed: list[str]) -> list[str]:
        """Put back what ``changed`` lists: a source's bytes written again, a compiled file compiled again, what
        was not there when this was taken deleted; returns one line a change, saying what was done or that it could
        not be (and keeps those in :attr:`broken`: the installation is not to be trusted until reinstalled)."""
        import shutil
        done = []
        for path in sorted(changed, key=lambda q: q.endswith(".pyc")):     # sources first, then what compiles them
            p = Path(path)
            if not self.under_roots(path):
                done.append(f"{path} (the checks imported it from outside the installation)")
            elif path in self.sources:
                if p.is_symlink() or p.is_file():
                    p.unlink()
                elif p.is_dir():
                    shutil.rmtree(p)
                p.write_bytes(self.sources[path])
                os.utime(path, ns=(self.mtimes[path], self.mtimes[path]))   # its compiled file stays valid
                self._fresh(path)
                done.append(f"{path} (changed: put back)")
            elif path not in self.existing:
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
                done.append(f"{path} (new: deleted)")
            elif p.parent.name == "__pycache__" and p.suffix == ".pyc":
                p.unlink(missing_ok=True)
                done.append(f"{path} (a compiled file: compiled again)" if self._compile(p) else
                            f"{path} (a compiled file: deleted)")
            else:
                done.append(f"{path} (changed or gone, and the grader has no copy of it: reinstall what it belongs to)")
                self.broken.append(path)
        return done

    def _fresh(self, source: str) -> None:
        """Compile ``source`` again unless its compiled file is there and names its size and time (as Python
        checks): so that no Python of the grade's, or of anyone's, writes one during a grade."""
        import struct
        pyc = importlib.util.cache_from_source(source)
        try:
            st = os.stat(source)
            with open(pyc, "rb") as f:
                head = f.read(16)
            if len(head) == 16 and struct.unpack("<4xIII", head) == (0, int(st.st_mtime) & 0xFFFFFFFF,
                                                                     st.st_size & 0xFFFFFFFF):
                return
        except OSError:
            pass
        self._compile(Path(pyc))

    def _compile(self, pyc: Path) -> bool:
        """Compile again the source whose compiled file ``pyc`` is (``__pycache__/NAME.TAG.pyc`` beside ``NAME.py``),
        as Python would at its next import: now, not during a later grade."""
        import py_compile
        source = pyc.parent.parent / (pyc.name.split(".")[0] + ".py")
        if not source.is_file() or pyc.name.count(".") != 2:
            return False
        from .syntax import LOCK
        try:
            with LOCK:
                py_compile.compile(str(source), cfile=str(pyc), doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
        except (py_compile.PyCompileError, OSError):
            return False
        return True
