"""The CPU kernels' build folder: a killed build never blocks later starts, and checkouts share a build."""
import fcntl
import multiprocessing
import os
import shutil
from pathlib import Path

import pytest

from engine.kernels import loader


def test_a_lock_file_left_by_a_killed_build_is_removed(tmp_path):
    (tmp_path / "lock").touch()  # what torch's build leaves when its process is killed mid-build
    with loader._building(tmp_path):
        assert not (tmp_path / "lock").exists()


def _hold_and_die(folder, ready):
    lock = open(folder / "build.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    ready.set()
    os._exit(9)  # dies holding the lock, as a SIGKILLed build would


def test_the_build_lock_of_a_dead_process_is_free(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    holder = ctx.Process(target=_hold_and_die, args=(tmp_path, ready))
    holder.start()
    assert ready.wait(60)
    holder.join(60)
    with loader._building(tmp_path):  # would block forever if the lock outlived its holder
        pass


def test_sources_are_compiled_from_a_copy_named_by_the_build_folder(tmp_path):
    sources = loader._copy_sources(tmp_path / "src")
    assert [s.name for s in sources] == list(loader._SOURCES)
    for s in sources:
        assert s.parent == tmp_path / "src"
        assert s.read_bytes() == (loader._CSRC / s.name).read_bytes()
    assert (tmp_path / "src" / "conversions.h").exists()  # headers the sources include travel too


def test_a_finished_build_loads_without_the_build_tooling(tmp_path, monkeypatch):
    """A clone with its own environment (torch at another path) finds the build of the same
    sources finished in the shared cache and loads it, instead of rebuilding from its ninja file."""
    built = loader.load_cpu_kernels()
    if built is None:
        pytest.skip("the CPU kernels cannot be built here")
    target = tmp_path / "kernels" / Path(built.__file__).parent.name
    target.mkdir(parents=True)
    shutil.copy(built.__file__, target)
    (target / loader._BUILT).touch()
    monkeypatch.setattr(loader, "cache_dir", lambda: tmp_path)
    from torch.utils import cpp_extension

    def rebuild(**kwargs):
        raise AssertionError("a finished build was built again")
    monkeypatch.setattr(cpp_extension, "load", rebuild)
    module = loader._build()
    assert module is not None and Path(module.__spec__.origin).parent == target
    assert module.gemm_isa() == built.gemm_isa()
