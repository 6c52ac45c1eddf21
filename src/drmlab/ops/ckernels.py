"""Building and loading the C kernels of ``drmlab.ops``: the one place that compiles, caches and
loads them.

Each operator with a C path keeps its source beside its Python code (``linear_scan/scan.c``,
``selective_scan/selective_scan.c``) and declares it here as a :class:`CKernel`.  On first use a
kernel is compiled with the system C compiler (plain C99, no torch headers) into a shared object
in a per-user cache, loaded with ctypes and handed to the operator's ``prepare`` function, which
binds the symbol signatures and checks the kernel.  Each kernel is its own shared object, so a
broken source disables only its own operator's C path.

Environment:

* ``DRMLAB_NO_CKERNEL=1``: never build or load a kernel; every operator takes its pure-torch
  path.
* ``DRMLAB_REQUIRE_CKERNEL=1``: a kernel that cannot be built, loaded or prepared raises
  :class:`CKernelUnavailable` whenever it is asked for, instead of quietly falling back to torch
  (.ci/run sets it, so kernel tests fail rather than skip).  ``DRMLAB_NO_CKERNEL`` takes
  precedence.
* ``DRMLAB_CACHE_DIR``: the cache directory; otherwise ``$XDG_CACHE_HOME/drmlab``, else
  ``~/.cache/drmlab``, else ``<tmpdir>/drmlab-<uid>``: the first that is writable and private (owned
  by this user, writable by nobody else, not a symbolic link); when none is, a fresh ``mkdtemp``
  directory of the process. A shared object is loaded only when it is private too.
* ``CC``: the compiler; otherwise ``cc``, ``gcc`` or ``clang`` on the PATH.

The shared object's name holds a hash of the source, the compiler and its version, the flags and
the platform; it is written atomically (compiled to a temporary name, then ``os.replace``), so
processes building the same kernel at once never load a half-written file.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "CKernel",
    "CKernelUnavailable",
    "register",
    "c_kernel_available",
    "c_kernel_status",
    "disabled_by_env",
    "required_by_env",
    "find_compiler",
    "compile_shared_object",
]

DISABLE_ENV = "DRMLAB_NO_CKERNEL"
REQUIRE_ENV = "DRMLAB_REQUIRE_CKERNEL"
CACHE_ENV = "DRMLAB_CACHE_DIR"
CFLAGS = ["-O3", "-std=c99", "-shared", "-fPIC", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]
LDLIBS = ["-lm"]
COMPILE_TIMEOUT_S = 120
# a kernel built for this processor (``CKernel(native=True)``): its vector width, its cache key holding the
# processor's feature flags, so a cache shared between machines never loads it on another processor
NATIVE_FLAGS = ("-march=native",)


class CKernelUnavailable(RuntimeError):
    """A C kernel was required (``DRMLAB_REQUIRE_CKERNEL=1``) but could not be built or loaded."""


class CompileError(RuntimeError):
    """The compiler ran and failed (no point retrying in another cache directory)."""


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def disabled_by_env() -> bool:
    """True when ``DRMLAB_NO_CKERNEL`` switches every C kernel off."""
    return _env_flag(DISABLE_ENV)


def required_by_env() -> bool:
    """True when ``DRMLAB_REQUIRE_CKERNEL`` makes an unavailable C kernel an error."""
    return _env_flag(REQUIRE_ENV)


def find_compiler() -> str | None:
    """The C compiler to use: ``$CC`` when it resolves, else cc, gcc or clang; None if none."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        found = shutil.which(cc.split()[0])
        if found:
            return found
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name)
        if found:
            return found
    return None


def cache_dirs() -> list[Path]:
    """The cache directories to try, in order."""
    dirs = []
    env = os.environ.get(CACHE_ENV)
    if env:
        dirs.append(Path(env))
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        dirs.append(Path(xdg) / "drmlab")
    try:
        dirs.append(Path.home() / ".cache" / "drmlab")
    except RuntimeError:  # no home directory
        pass
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    dirs.append(Path(tempfile.gettempdir()) / f"drmlab-{uid}")
    return dirs


def unsafe_reason(path: Path) -> str | None:
    """Why ``path`` (a cache directory or a shared object in it) must not be compiled into or loaded
    from, or None: it must belong to this user and be writable by nobody else, or another user could
    plant a library that this process would then execute. A directory must not be a symbolic link
    (``<tmpdir>/drmlab-<uid>`` could point anywhere)."""
    if not hasattr(os, "getuid"):  # no POSIX owners (Windows): nothing to check
        return None
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if info.st_uid != os.getuid():
        return f"belongs to uid {info.st_uid}, not to this user ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def private_cache_dir(path: Path) -> Path:
    """``path`` created (mode 0700) if missing and checked by :func:`unsafe_reason`; raises
    ``PermissionError`` naming the directory and the reason when it is not private."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    why = unsafe_reason(path)
    if why is not None:
        raise PermissionError(f"cache directory {path} {why}: not used")
    return path


def _process_cache_dir() -> Path:
    """The last resort when no shared cache directory is private: a fresh ``mkdtemp`` directory of
    this process (mode 0700; the kernel is rebuilt in every such process)."""
    global _PROCESS_DIR
    if _PROCESS_DIR is None:
        _PROCESS_DIR = Path(tempfile.mkdtemp(prefix="drmlab-kernels-"))
        atexit.register(shutil.rmtree, _PROCESS_DIR, True)  # a loaded library stays mapped
    return _PROCESS_DIR


_PROCESS_DIR: Path | None = None


def compile_shared_object(cc: str, source: Path, dest: Path, flags: tuple[str, ...] = ()) -> None:
    """Compile ``source`` into the shared object ``dest`` atomically: to a temporary name in the
    same directory, then ``os.replace``; ``flags`` are added to :data:`CFLAGS`.  Raises
    :class:`CompileError` when the compiler fails."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dest.stem + ".", suffix=".tmp.so", dir=dest.parent)
    os.close(fd)
    try:
        proc = subprocess.run(
            [cc, *CFLAGS, *flags, "-o", tmp, str(source), *LDLIBS],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        if proc.returncode != 0:
            raise CompileError(f"{cc} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def cpu_fingerprint() -> str:
    """What a ``-march=native`` build depends on: the processor's feature flags (Linux), else its name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _shared_object_name(name: str, cc: str, source: Path, flags: tuple[str, ...] = ()) -> str:
    try:
        version = subprocess.run(
            [cc, "--version"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"cannot run {cc}: {exc}") from exc
    key = hashlib.sha256()
    for part in (
        source.read_bytes(),
        cc.encode(),
        version.encode(),
        " ".join(CFLAGS + list(flags) + LDLIBS).encode(),
        f"{platform.machine()}|{sys.platform}".encode(),
        (cpu_fingerprint() if NATIVE_FLAGS[0] in flags else "").encode(),
    ):
        key.update(part)
    return f"drm_{name}_{key.hexdigest()[:20]}.so"


class CKernel:
    """One C source, built into its own shared object on first use.

    ``prepare(lib)`` is the owning operator's step after loading: bind the symbols' argument and
    return types and check the kernel (raising rejects it).  The outcome of the first load is
    kept for the life of the process.  ``native``: build for this processor (:data:`NATIVE_FLAGS`), or,
    where the compiler refuses that, as every other kernel is built.
    """

    def __init__(self, name: str, source: Path, prepare: Callable[[ctypes.CDLL], None], native: bool = False):
        self.name, self.native = name, native
        self.source = Path(source)
        self.prepare = prepare
        self._lock = threading.Lock()
        self._tried = False
        self._lib: ctypes.CDLL | None = None
        self._path: str | None = None
        self._error: str | None = None

    def library(self) -> ctypes.CDLL | None:
        """The loaded and prepared library; None when disabled or unavailable.  Raises
        :class:`CKernelUnavailable` instead of returning None when ``DRMLAB_REQUIRE_CKERNEL`` is
        set (and the kernel is not disabled)."""
        if disabled_by_env():
            return None
        if not self._tried:
            with self._lock:
                if not self._tried:
                    self._load()
                    self._tried = True
        if self._lib is None and required_by_env():
            raise CKernelUnavailable(
                f"the {self.name} C kernel is required ({REQUIRE_ENV}=1) but unavailable: {self._error}"
            )
        return self._lib

    def available(self) -> bool:
        """True when the kernel is built, loaded, prepared and not disabled by the environment.
        The first call builds it (about a second) unless a cached build exists."""
        return self.library() is not None

    def unavailable_on(self, device, dtype, dtypes) -> str | None:
        """Why this CPU kernel cannot run on tensors of ``device`` and compute ``dtype`` (it computes in
        ``dtypes``), or None when it can: the reason a backend gives."""
        if device.type != "cpu":
            return "the C kernel runs on CPU tensors only"
        if dtype not in dtypes:
            names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
            return f"the C kernel computes in {names} only"
        if disabled_by_env():
            return f"disabled by {DISABLE_ENV}"
        if not self.available():
            return self.status()["error"]
        return None

    def status(self) -> dict:
        """Diagnostics: availability, the shared object's path, the error that made it
        unavailable, the source.  Never raises (loads the kernel when not yet tried)."""
        disabled = disabled_by_env()
        try:
            lib = self.library()
        except CKernelUnavailable:
            lib = None
        return {
            "available": lib is not None,
            "disabled_by_env": disabled,
            "path": self._path,
            "error": self._error,
            "source": str(self.source),
        }

    def _load(self) -> None:
        try:
            if not self.source.is_file():
                raise RuntimeError(f"kernel source missing: {self.source}")
            cc = find_compiler()
            if cc is None:
                raise RuntimeError("no C compiler found (set CC, or install gcc/clang)")
            flags = NATIVE_FLAGS if self.native else ()
            errors = []
            lib = None
            for cache_dir in [*cache_dirs(), None]:
                try:
                    cache_dir = private_cache_dir(cache_dir) if cache_dir is not None else _process_cache_dir()
                    path = cache_dir / _shared_object_name(self.name, cc, self.source, flags)
                    if not path.is_file() and flags:
                        try:
                            compile_shared_object(cc, self.source, path, flags)
                        except CompileError:  # a compiler without -march=native: the portable build
                            flags = ()
                            path = cache_dir / _shared_object_name(self.name, cc, self.source, flags)
                    if not path.is_file():
                        compile_shared_object(cc, self.source, path, flags)
                    why = unsafe_reason(path)
                    if why is not None:
                        raise PermissionError(f"{path} {why}: not loaded")
                    lib = ctypes.CDLL(str(path))
                    self._path = str(path)
                    break
                except CompileError as exc:
                    errors.append(str(exc))
                    break
                except (OSError, subprocess.SubprocessError) as exc:
                    # unwritable directory, unloadable file: try the next cache directory
                    errors.append(str(exc) if isinstance(exc, PermissionError) else f"{cache_dir}: {exc}")
            if lib is None:
                raise RuntimeError("; ".join(errors) or "no usable cache directory")
            self.prepare(lib)
            self._lib, self._error = lib, None
        except Exception as exc:  # any failure means: the operator takes its torch path
            self._lib, self._path = None, None
            self._error = f"{type(exc).__name__}: {exc}"


_REGISTRY: dict[str, CKernel] = {}


def register(kernel: CKernel) -> CKernel:
    """Record ``kernel`` as one of drmlab's C kernels (for :func:`c_kernel_status`)."""
    if kernel.name in _REGISTRY:
        raise ValueError(f"a C kernel named {kernel.name!r} is already registered")
    _REGISTRY[kernel.name] = kernel
    return kernel


def c_kernel_available() -> bool:
    """True when every C kernel of ``drmlab.ops`` is built, loaded and enabled."""
    return all(kernel.available() for kernel in _REGISTRY.values())


def c_kernel_status() -> dict:
    """Each C kernel's :meth:`CKernel.status`, by name (``"linear_scan"``, ``"selective_scan"``)."""
    return {name: kernel.status() for name, kernel in _REGISTRY.items()}
