"""The compile cache: compiled executables on disk, shared by every process on the machine (`Entry`), and the
last ones this process compiled or read, in memory (`Recent`).

An entry is keyed by everything that changes the executable: the traced module (its bytecode without
locations: `mlir_context.fingerprint`), the pass pipeline with its options, the XLA compile options, the
jax / jaxlib / loopfuse versions (and a digest of loopfuse's sources), the platform, the devices (kind, id,
count), and $XLA_FLAGS.
It holds jaxlib's own serialization of the executable (``LoadedExecutable.serialize``) and the
final module as MLIR bytecode (its ``@main`` signature maps results back to outputs).

Writes go to a temporary file renamed into place, so readers never see half an entry and
concurrent writers of one entry all succeed. An entry that is corrupt, truncated or written by
other versions gives one `CacheWarning` and the program is recompiled (and the entry rewritten);
a folder that cannot be written gives a warning and the program runs uncached. Programs with
host callbacks (``jax.debug.print``, ``pure_callback``) are never cached: their callbacks live
in the process that traced them. Only point the cache at a folder you trust: loading an
executable runs its code.

In memory, a step built again for a program this process compiled or read from disk (``compile_step(fn)`` called
anew, `minimize` of a new loss function of the same code, its data an argument) is loaded as it is from disk, with no
pass and no XLA compile (jax.jit compiles a new function object again), under an entry's key.
"""
import functools
import hashlib
import io
import json
import os
import platform
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import jax
import jax.extend.backend as jeb
import jaxlib
from jaxlib.mlir import ir

from .. import passes, settings
from ..errors import warn
from .pipeline import write_atomic

CACHE_ENV = "LOOPFUSE_CACHE_DIR"
FORMAT = 1
_MAGIC = b"loopfuse compile cache\n"


class CacheWarning(UserWarning):
    """A compile cache entry or folder could not be used; the program was compiled (or runs) without it."""


def folder(explicit) -> Path | None:
    """The cache folder: the keyword, else $LOOPFUSE_CACHE_DIR, else None (no cache)."""
    return settings.folder(explicit, CACHE_ENV)


@functools.cache
def versions() -> dict:
    """What built the entry: jax, jaxlib, loopfuse (with a digest of its sources), the format."""
    sources = hashlib.sha256()
    for root in (Path(__file__).parents[1], *map(Path, passes.__path__)):     # loopfuse/ with its subpackages
        for path in sorted(root.rglob("*.py")):
            sources.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    try:
        version = metadata.version("loopfuse")
    except metadata.PackageNotFoundError:  # run from a source tree (the sources digest still tells)
        version = "unknown"
    return {"format": FORMAT, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "loopfuse": version, "loopfuse-sources": sources.hexdigest()[:16]}


def key(module: bytes, pipeline: str, devices, options) -> str:
    """The entry key of a module (its `fingerprint`) run through `pipeline` and compiled with `options` on
    `devices`."""
    backend = jeb.get_backend(devices[0].platform)
    material = {
        "versions": versions(),
        "platform": [backend.platform, backend.platform_version, _host_cpu() if backend.platform == "cpu" else ""],
        "devices": [[d.platform, d.device_kind, d.id, d.process_index] for d in devices],
        "options": hashlib.sha256(options.SerializeAsString()).hexdigest(),
        "xla_flags": sorted(os.environ.get("XLA_FLAGS", "").split()),
        "pipeline": pipeline,
    }
    h = hashlib.sha256(json.dumps(material, sort_keys=True).encode())
    h.update(module)
    return h.hexdigest()


@functools.cache
def _host_cpu() -> str:
    """The host CPU's model and feature flags (XLA:CPU code is compiled for them)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine() + " " + platform.processor()
    lines = [l for l in info.splitlines() if l.startswith(("model name", "flags", "Features"))]
    return platform.machine() + " " + hashlib.sha256("\n".join(sorted(set(lines))).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Entry:
    """One program's place in a cache folder."""

    path: Path
    devices: list
    options: object                # the xc.CompileOptions it was compiled with

    @classmethod
    def of(cls, where: Path, key: str, devices, options) -> "Entry":
        """The entry for a program under its `key`."""
        return cls(where / f"{key}.lfx", list(devices), options)

    def load(self, context: ir.Context):
        """(executable, final module in `context`), or None when absent or unusable (one warning)."""
        try:
            data = self.path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            return self._unusable(f"it cannot be read ({e})")
        try:
            executable_bytes, module_bytes = _unpack(data)
        except ValueError as e:
            return self._unusable(str(e))
        try:
            backend = jeb.get_backend(self.devices[0].platform)
            executable = backend.deserialize_executable(executable_bytes, list(self.devices), self.options)
            module = ir.Module.parse(module_bytes, context)
        except Exception as e:  # noqa: BLE001 -- any failure to load means: compile instead
            return self._unusable(f"it does not load ({type(e).__name__}: {e})")
        return executable, module

    def store(self, executable, module: ir.Module) -> bool:
        """Write the entry atomically; on failure warn and return False (the program runs uncached)."""
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
        data = _pack(executable.serialize(), buf.getvalue())
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, data)     # other users of a shared folder may read it, as the umask says
            return True
        except OSError as e:
            warn(f"loopfuse compile cache: cannot write to {self.path.parent} ({e}); running uncached", CacheWarning)
            return False

    def _unusable(self, why: str) -> None:
        warn(f"loopfuse compile cache: entry {self.path} is unusable: {why}; recompiling", CacheWarning)
        return None


def _pack(executable: bytes, module: bytes) -> bytes:
    payload = executable + module
    header = json.dumps({"versions": versions(), "executable": len(executable), "module": len(module),
                         "sha256": hashlib.sha256(payload).hexdigest()}).encode()
    return _MAGIC + struct.pack(">Q", len(header)) + header + payload


def _unpack(data: bytes) -> tuple[bytes, bytes]:
    """(executable, module bytecode) of an entry; ValueError saying what is wrong with it."""
    if not data.startswith(_MAGIC):
        raise ValueError("it is not a loopfuse compile cache entry")
    at = len(_MAGIC) + 8
    if len(data) < at:
        raise ValueError("it is truncated")
    (n,) = struct.unpack(">Q", data[len(_MAGIC):at])
    try:
        header = json.loads(data[at:at + n])
        sizes = header["executable"], header["module"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("its header is corrupt") from None
    if header.get("versions") != versions():
        raise ValueError(f"it was written by {header.get('versions')}, not {versions()}")
    payload = data[at + n:]
    if len(payload) != sum(sizes):
        raise ValueError(f"it is truncated ({len(payload)} of {sum(sizes)} bytes)")
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise ValueError("its checksum does not match (corrupt)")
    return payload[:sizes[0]], payload[sizes[0]:]


class Recent:
    """The executables this process compiled or read from disk last, `size` of them (none with `size` 0), each with
    its final module (as bytecode, parsed into the context of the step that loads it), by their entry `key`. A program
    whose traced module's `fingerprint` is longer than `max_bytes` is not kept: its length is arrays it closed over,
    embedded as constants, which its executable holds in device memory, and which would then outlive the step
    and the function that closed over them."""

    def __init__(self, size: int, max_bytes: int):
        self.size, self.max_bytes = size, max_bytes
        self._kept: OrderedDict[str, tuple] = OrderedDict()
        self._lock = threading.Lock()

    def keeps(self, module: bytes) -> bool:
        """Whether a program of this traced module (its `fingerprint`) is kept: not where nothing is (`size` 0),
        nor a module too large."""
        return self.size > 0 and len(module) <= self.max_bytes

    def load(self, key: str, context: ir.Context):
        """(executable, final module in `context`) kept under `key`, or None."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                return None
            self._kept.move_to_end(key)
        executable, module = kept
        return executable, ir.Module.parse(module, context)

    def store(self, key: str, executable, module: ir.Module) -> None:
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
        with self._lock:
            self._kept[key] = executable, buf.getvalue()
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)

    def clear(self) -> None:
        """Forget every executable kept (a benchmark's compile from nothing)."""
        with self._lock:
            self._kept.clear()


RECENT = Recent(size=32, max_bytes=2 << 20)
