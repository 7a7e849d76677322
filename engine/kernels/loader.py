"""Formwork's own CPU kernels (engine/kernels/csrc/), compiled on first use and cached.

torch's CPU ops cannot read a paged KV cache in place: decode attention in plain torch gathers
every request's blocks into a padded copy, then reads it again in SDPA; the kernel reads the
blocks where they are. The decoder's elementwise steps (residual + RMSNorm, SiLU-and-multiply,
rotary) are fused, so a decode batch wakes no OpenMP threads for them; the bf16 matmuls read one
packed copy of each weight (gemm.cpp). The module is built with torch's extension tooling (a C++
compiler and ninja) into $FORMWORK_CACHE/kernels/<cpu features + flags + torch + sources> the
first time an engine starts (about 45 s on 2 cores; `make setup` does it), then loads in a
fraction of a second, from any clone or environment with the same sources and torch. Where it
cannot be built, the engine says why once and uses torch ops.

FORMWORK_CPU_ISA=avx2 builds for AVX2 and FMA only (`-march=x86-64-v3`, its own build folder): the
kernels a CPU without AVX-512 runs, so that they can be tested on one that has it (engine.config
holds torch's own CPU ops to AVX2 as well, and dtype auto chooses as on such a CPU).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from engine.config import cpu_flags, cpu_isa
from engine.model_files import cache_dir

logger = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = ("bindings.cpp", "paged_attention.cpp", "fused_ops.cpp", "gemm.cpp", "amx_gemm.cpp", "worker_pool.cpp",
            "decoder_layer.cpp", "gemm_fp32.cpp", "int8_gemm.cpp", "amx_int8_gemm.cpp",
            "int4_gemm.cpp", "amx_int4_gemm.cpp")
# FORMWORK_CPU_ISA -> the target flags of the build
_ISA_FLAGS = {"native": ["-march=native"], "avx2": ["-march=x86-64-v3", "-mtune=native"]}
_BUILT = "built"  # written once a build has loaded: its module is whole
_lock = threading.Lock()
_state: dict[str, ModuleType | None] = {}


def load_cpu_kernels() -> ModuleType | None:
    """The compiled module, or None when it cannot be built here (FORMWORK_CPU_KERNELS=0 disables it)."""
    if "module" in _state:  # the decoder asks on every op: no lock once settled
        return _state["module"]
    with _lock:
        if "module" not in _state:
            _state["module"] = _build()
        return _state["module"]


def _build() -> ModuleType | None:
    if os.environ.get("FORMWORK_CPU_KERNELS", "1") == "0":
        return None
    isa = cpu_isa()
    if isa not in _ISA_FLAGS:
        logger.warning("FORMWORK_CPU_ISA=%s is not one of %s: using native", isa, ", ".join(_ISA_FLAGS))
        isa = "native"
    try:
        from torch.utils import cpp_extension
        cflags = ["-O3", *_ISA_FLAGS[isa], "-ffast-math", "-fopenmp"]
        tag = _build_tag(cflags)
        name = f"formwork_cpu_kernels_{tag}"
        build_dir = cache_dir() / "kernels" / tag
        build_dir.mkdir(parents=True, exist_ok=True)
        with _building(build_dir):
            if (build_dir / _BUILT).exists():
                return _import(name, build_dir / f"{name}.so")
            sources = _copy_sources(build_dir / "src")
            module = cpp_extension.load(
                name=name, sources=[str(s) for s in sources], build_directory=str(build_dir),
                extra_cflags=cflags, extra_ldflags=["-fopenmp"], verbose=False)
            (build_dir / _BUILT).touch()
            return module
    except Exception as e:  # no compiler, no ninja, a build error: the torch path still works
        logger.warning("CPU kernels unavailable, using the slower torch attention path: %s",
                       str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__)
        return None


def _build_tag(cflags: list[str]) -> str:
    """-march=native code runs only on CPUs with the same features: one build per feature set (and
    flags), so a cache folder shared between machines never hands one a module it cannot execute.
    The sources' bytes and torch's version are part of the tag too: two checkouts with different
    kernels sharing one cache each keep their own build, and clones of the same sources (each with
    its own environment, torch at another path) share one."""
    import torch
    digest = hashlib.sha1(" ".join(cpu_flags() + cflags).encode())
    digest.update(f"torch {torch.__version__} {torch.version.git_version}".encode())
    for source in sorted(_CSRC.iterdir()):
        digest.update(source.name.encode() + source.read_bytes())
    return digest.hexdigest()[:10]


def _import(name: str, library: Path) -> ModuleType:
    """A finished build, loaded without torch's extension tooling: its ninja file names the
    paths of the environment that built it, and from another one it would rebuild everything."""
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _building(build_dir: Path) -> Iterator[None]:
    """One build at a time per folder, under a lock the kernel drops when its holder dies. torch's
    own lock file outlives a build that was killed, and every later start would wait on it forever;
    while this lock is held nobody else is building, so such a file is stale and goes."""
    with open(build_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _copy_sources(target: Path) -> list[Path]:
    """The build compiles a copy inside its folder: ninja's commands name the sources' paths, so two
    checkouts with the same sources compiling from their own folders would rebuild each other's
    module on every start. The folder's tag covers the sources' bytes, so a copy there is current."""
    target.mkdir(exist_ok=True)
    for source in _CSRC.iterdir():
        if source.is_file() and not (target / source.name).exists():
            partial = target / f".{source.name}.partial"  # a copy cut short never passes for the source
            shutil.copyfile(source, partial)
            partial.replace(target / source.name)
    return [target / name for name in _SOURCES]
