"""`make ops`'s compiler wrapper (tools/pch_cxx.py): torch's header precompiled once per set of
flags, the objects those of a plain compile, and ninja finding them up to date without it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools import pch_cxx

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "tools" / "pch_bin"
NINJA = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")  # pip's, beside torch
# a stand-in for torch's header: a template a source instantiates, and the op's name unused in it
HEADER = """#pragma once
template <typename T> T twice(T x) { return x + x; }
inline int header_version() { return 7; }
"""
USES = """#include <torch/extension.h>
#include "local.h"
int NAME() { return twice(NUMBER) + header_version() + LOCAL; }
"""
MAIN = """#include <cstdio>
int first(); int second(); int plain();
int main() { std::printf("%d %d %d\\n", first(), second(), plain()); }
"""
# torch's build.ninja, cut down: one flag set, the op's name per source, gcc dependency files
NINJA_FILE = """ninja_required_version = 1.3
cxx = c++
cflags = -isystem {include} -O2 -g -std=c++17 -fPIC
rule compile
  command = $cxx -MMD -MF $out.d $cflags -DTORCH_EXTENSION_NAME=$op -c $in -o $out
  depfile = $out.d
  deps = gcc
rule link
  command = $cxx $in -o $out
build first.o: compile {src}/first.cpp
  op = first
build second.o: compile {src}/second.cpp
  op = second
build plain.o: compile {src}/plain.cpp
  op = plain
build main.o: compile {src}/main.cpp
  op = main
build prog: link first.o second.o plain.o main.o
default prog
"""


def _project(tmp_path: Path) -> tuple[Path, Path]:
    include, src, build = tmp_path / "include", tmp_path / "src", tmp_path / "build"
    (include / "torch").mkdir(parents=True)
    (include / "torch" / "extension.h").write_text(HEADER)
    src.mkdir()
    (src / "first.cpp").write_text(USES.replace("NAME", "first").replace("NUMBER", "1"))
    (src / "second.cpp").write_text(USES.replace("NAME", "second").replace("NUMBER", "20"))
    (src / "local.h").write_text("#define LOCAL 0\n")
    (src / "plain.cpp").write_text("int plain() { return 300; }\n")  # no torch header
    (src / "main.cpp").write_text(MAIN)
    build.mkdir()
    (build / "build.ninja").write_text(NINJA_FILE.format(include=include, src=src))
    return src, build


def _ninja(build: Path, *, wrapped: bool, pch_dir: Path | None = None) -> str:
    env = dict(os.environ)
    env.pop("ZERO_KIT_PCH_DIR", None)
    if wrapped:
        env.update(PATH=f"{SHIM}{os.pathsep}{env['PATH']}", ZERO_KIT_PCH_DIR=str(pch_dir))
    done = subprocess.run([NINJA, "-j", "2"], cwd=build, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_sources_with_the_header_share_one_precompiled_header_and_ninja_needs_nothing_after(
        tmp_path):
    src, build = _project(tmp_path)
    pch_dir = tmp_path / "pch"
    _ninja(build, wrapped=True, pch_dir=pch_dir)
    # one header for the two op names (the op's name is not part of the key), none for plain.cpp
    built = list(pch_dir.glob("*/kit_torch.h.gch"))
    assert len(built) == 1 and not list(pch_dir.glob("*/failed"))
    ran = subprocess.run([str(build / "prog")], capture_output=True, text=True)
    assert ran.stdout.split() == ["9", "47", "300"]
    # the objects' dependencies name no injected header: delete the folder, and a plain ninja
    # (the later loads of an op, without the wrapper) finds everything up to date
    deps = subprocess.run([NINJA, "-t", "deps"], cwd=build, capture_output=True, text=True).stdout
    assert "kit_torch.h" not in deps and f"{src}/local.h" in deps
    shutil.rmtree(pch_dir)
    assert "no work to do" in _ninja(build, wrapped=False)
    # a changed header of the op's own still rebuilds the sources that include it, and only those
    (src / "local.h").write_text("#define LOCAL 1000\n")
    out = _ninja(build, wrapped=False)
    assert "-o first.o" in out and "-o second.o" in out and "-o plain.o" not in out
    ran = subprocess.run([str(build / "prog")], capture_output=True, text=True)
    assert ran.stdout.split() == ["1009", "1047", "300"]


def test_the_precompiled_header_is_what_the_compile_reads(tmp_path):
    """GCC's -H marks a precompiled header it used with '!' (an 'x' when it refused it)."""
    src, build = _project(tmp_path)
    env = dict(os.environ, PATH=f"{SHIM}{os.pathsep}{os.environ['PATH']}",
               ZERO_KIT_PCH_DIR=str(tmp_path / "pch"))
    command = ["c++", "-H", "-isystem", str(tmp_path / "include"), "-O2",
               "-DTORCH_EXTENSION_NAME=first", "-c", str(src / "first.cpp"), "-o",
               str(build / "first.o")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=build)
    assert done.returncode == 0, done.stderr
    assert any(line.startswith("! ") and line.endswith("kit_torch.h.gch")
               for line in done.stderr.splitlines()), done.stderr


def test_a_header_that_cannot_be_precompiled_alone_leaves_the_compile_as_it_was(tmp_path):
    """A header that needs what its source defines first fails as a precompiled header: the
    wrapper records that and every compile with those flags runs the plain command."""
    src, build = _project(tmp_path)
    (tmp_path / "include" / "torch" / "extension.h").write_text(
        "#pragma once\n#ifndef KIT_NEEDS\n#error define KIT_NEEDS first\n#endif\n"
        "inline int needs() { return KIT_NEEDS; }\n")
    (src / "needs.cpp").write_text("#define KIT_NEEDS 5\n#include <torch/extension.h>\n"
                                   "int f() { return needs(); }\n")
    env = dict(os.environ, PATH=f"{SHIM}{os.pathsep}{os.environ['PATH']}",
               ZERO_KIT_PCH_DIR=str(tmp_path / "pch"))
    for _ in range(2):  # the second finds the failure recorded and does not try again
        done = subprocess.run(["c++", "-isystem", str(tmp_path / "include"), "-c",
                               str(src / "needs.cpp"), "-o", str(build / "needs.o")],
                              env=env, capture_output=True, text=True, cwd=build)
        assert done.returncode == 0, done.stderr
    left = sorted(p.name for p in (tmp_path / "pch").glob("*/*"))
    assert left == ["failed", "kit_torch.h", "lock"]  # no .gch
    assert "KIT_NEEDS" in next((tmp_path / "pch").glob("*/failed")).read_text()


def test_compile_lines_are_read_as_torch_writes_them():
    args = ["-MMD", "-MF", "a.o.d", "-DTORCH_EXTENSION_NAME=cpu_adam", "-isystem", "/t/include",
            "-O3", "-g", "-c", "/s/cpu_adam.cpp", "-o", "a.o"]
    flags, source, depfile = pch_cxx.parse_compile(args)
    assert source == "/s/cpu_adam.cpp" and depfile == "a.o.d"
    assert flags == ["-DTORCH_EXTENSION_NAME=cpu_adam", "-isystem", "/t/include", "-O3", "-g"]
    other = ["-DTORCH_EXTENSION_NAME=fused_adam" if f.startswith("-DTORCH") else f for f in flags]
    assert pch_cxx.flags_key(flags) == pch_cxx.flags_key(other)
    assert pch_cxx.flags_key(flags) != pch_cxx.flags_key(flags + ["-O0"])
    # links, probes and compiles that choose their first header themselves go through unchanged
    assert pch_cxx.parse_compile(["a.o", "b.o", "-shared", "-o", "x.so"]) is None
    assert pch_cxx.parse_compile(["-include", "h.h", "-c", "a.cpp", "-o", "a.o"]) is None
    assert pch_cxx.parse_compile(["-c", "a.cpp", "b.cpp", "-o", "a.o"]) is None


def test_the_real_compiler_is_the_next_one_on_path(tmp_path, monkeypatch):
    other = tmp_path / "other"
    other.mkdir()
    (other / "c++").write_text("#!/bin/sh\n")
    (other / "c++").chmod(0o755)
    monkeypatch.setenv("PATH", f"{SHIM}{os.pathsep}{other}")
    assert pch_cxx.real_compiler(skip=str(SHIM)) == str(other / "c++")
    monkeypatch.setenv("PATH", str(SHIM))
    with pytest.raises(SystemExit, match="no c\\+\\+ on PATH"):
        pch_cxx.real_compiler(skip=str(SHIM))
