"""The host kernels' build: once per (sources, compiler, CPU), into the cache, atomically; a changed source builds
anew; no compiler, a failing one, or FT_HOST_KERNELS=off leave the engine on torch with the reason said."""

from __future__ import annotations

import shutil

import pytest

from freetoken.host import build


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A build state of its own: an empty cache folder and no library loaded yet in this process."""
    monkeypatch.setenv("FT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_LIBS", {})
    monkeypatch.setattr(build, "_REASONS", {})
    return tmp_path


@pytest.mark.slow
def test_built_once_into_the_cache_and_rebuilt_after_an_edit(fresh, monkeypatch):
    if build.compiler() is None:
        pytest.skip("no C compiler on this machine")
    src = fresh / "csrc"
    shutil.copytree(build.CSRC, src)
    monkeypatch.setattr(build, "CSRC", src)
    lib = build.load("generic")
    assert lib is not None and build.unavailable_reason("generic") is None
    built = sorted((fresh / "cache" / "host").glob("libfthost-generic-*.so"))
    assert len(built) == 1 and not list((fresh / "cache" / "host").glob("*.tmp*"))
    monkeypatch.setattr(build, "_LIBS", {})
    build.load("generic")  # same sources: the cached file, no second build
    assert sorted((fresh / "cache" / "host").glob("libfthost-generic-*.so")) == built
    (src / "small.c").write_text((src / "small.c").read_text() + "\n/* edited */\n")
    monkeypatch.setattr(build, "_LIBS", {})
    build.load("generic")
    assert len(list((fresh / "cache" / "host").glob("libfthost-generic-*.so"))) == 2


def test_no_compiler_is_a_reason_not_an_error(fresh, monkeypatch):
    monkeypatch.setattr(build, "compiler", lambda: None)
    assert build.load("native") is None
    assert "no C compiler" in build.unavailable_reason("native")


def test_a_failing_compiler_names_itself(fresh, monkeypatch):
    monkeypatch.setattr(build, "compiler", lambda: "false")  # exits 1 without a word
    assert build.load("native") is None
    assert build.unavailable_reason("native").startswith("false could not build the host kernels")


def test_switched_off(fresh, monkeypatch):
    monkeypatch.setenv("FT_HOST_KERNELS", "off")
    assert build.load("native") is None and build.unavailable_reason("native") == "FT_HOST_KERNELS=off"


def test_unknown_variant():
    with pytest.raises(ValueError, match="variant 'avx9' is not one of native, generic"):
        build.load("avx9")
