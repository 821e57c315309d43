"""A C++ compiler wrapper for `make ops`: torch's headers parsed once per set of flags, not once
per source file.

DeepSpeed's JIT builds run ``c++ -MMD -MF X.o.d FLAGS -c SRC -o X.o`` (torch's build.ninja) for
each source file, and each file includes ``torch/extension.h``: about 430,000 lines, 28 s of a
42 s compile of one of async_io's 12 files on 2 cores. Placed first on PATH as ``c++`` (the
``tools/pch_bin/c++`` shim), this wrapper builds that header once as a GCC precompiled header for
each set of flags (``ZERO_KIT_PCH_DIR/<key>/``) and compiles each source that includes it with
``-include`` of that header: 13 s instead of 42 s. The header is then read before the source's
own first lines, not where the source includes it: the same program as long as nothing the source
defines before that point changes the header, which holds for DeepSpeed's ops (their files include
standard headers or their own before it, and define nothing first). Checked on one file each of
async_io and cpu_adam: the same symbols and the same ``.text`` bytes as the plain compile, only
inline functions' sections in another order. The command line ninja records is the plain one, so
a later load without the wrapper finds every op up to date; the dependency file loses the injected
header (it lives in a folder `make ops` deletes afterwards).

Anything else (a link, a probe, a source without torch's header, ``ZERO_KIT_PCH_DIR`` unset) goes
to the real compiler unchanged; so does a compile whose header could not be precompiled. (A
compiler that reads no ``.gch``, clang, includes the header as text: the same object, no faster.)

Measured on 2 cores (2026-12-07), DeepSpeed's four CPU ops two at a time: 596 and 630 s of
compiler CPU time with it, 814 and 947 s without; 366 and 395 s of wall time, 437 and 508 s.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HEADER = "torch/extension.h"
#: flags that name the op (its Python module), which torch's header never reads: left out of the
#: precompiled header's flags and key, so ops built with the same flags share one (GCC refuses a
#: header built with a macro defined otherwise than in the compile that uses it)
_PER_SOURCE = ("-DTORCH_EXTENSION_NAME=",)


def real_compiler(name: str = "c++", skip: str | None = None) -> str:
    """The first ``name`` on PATH that is not in the folder ``skip`` (the shim's own)."""
    skip = os.path.realpath(skip) if skip else None
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if folder and (skip is None or os.path.realpath(folder) != skip):
            found = shutil.which(name, path=folder)
            if found:
                return found
    raise SystemExit(f"pch_cxx: no {name} on PATH besides the wrapper's own folder")


#: options whose value is the next argument
_TAKES_VALUE = {"-o", "-MF", "-MT", "-MQ", "-I", "-isystem", "-iquote", "-D", "-U", "-include",
                "-x"}


def parse_compile(args: list[str]) -> tuple[list[str], str, str | None] | None:
    """(flags, source, dependency file) of a one-source C++ compile to an object, or None. The
    flags leave out the source, ``-c``, ``-o OUT``, ``-MMD`` and ``-MF FILE``; a compile that picks
    its own first header or language (``-include``, ``-x``) is not one."""
    if "-c" not in args:
        return None
    flags, sources, depfile, i = [], [], None, 0
    while i < len(args):
        arg, value = args[i], args[i + 1] if i + 1 < len(args) else None
        if arg in ("-include", "-x"):
            return None
        if arg in _TAKES_VALUE:
            if arg == "-MF":
                depfile = value
            elif arg != "-o":
                flags += [arg, value]
            i += 2
            continue
        if arg.endswith((".cpp", ".cc", ".cxx")) and not arg.startswith("-"):
            sources.append(arg)
        elif arg not in ("-c", "-MMD"):
            flags.append(arg)
        i += 1
    return (flags, sources[0], depfile) if len(sources) == 1 and "-o" in args else None


def header_flags(flags: list[str]) -> list[str]:
    """The flags a precompiled header is built with: all but those naming the op."""
    return [f for f in flags if not f.startswith(_PER_SOURCE)]


def flags_key(flags: list[str]) -> str:
    """The folder name of the precompiled header for these flags."""
    return hashlib.sha256("\0".join(header_flags(flags)).encode()).hexdigest()[:16]


def includes_header(real: str, flags: list[str], source: str) -> bool:
    """Whether compiling ``source`` with ``flags`` reads torch's extension header (its -M list)."""
    done = subprocess.run([real, *flags, "-M", source], capture_output=True, text=True)
    return done.returncode == 0 and f"/{HEADER}" in done.stdout


def precompiled_header(real: str, flags: list[str], folder: Path) -> Path | None:
    """The header to ``-include`` for these flags, built once (other compiles wait for it); None
    when it could not be built."""
    where = folder / flags_key(flags)
    where.mkdir(parents=True, exist_ok=True)
    header = where / "kit_torch.h"
    with open(where / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (where / "failed").exists():
            return None
        if not (where / "kit_torch.h.gch").exists():
            header.write_text(f"#include <{HEADER}>\n")
            partial = where / "kit_torch.h.gch.partial"
            done = subprocess.run([real, *header_flags(flags), "-x", "c++-header", str(header),
                                   "-o", str(partial)], capture_output=True, text=True)
            if done.returncode != 0:
                (where / "failed").write_text(done.stderr)
                return None
            partial.rename(where / "kit_torch.h.gch")
    return header


def drop_from_depfile(depfile: str, header: Path) -> None:
    """Take the injected header out of a Make-style dependency file."""
    path = Path(depfile)
    if not path.exists():
        return
    text = path.read_text()
    kept = [token for token in text.replace("\\\n", " ").split() if token != str(header)]
    path.write_text(" \\\n  ".join(kept) + "\n")


def main(args: list[str]) -> int:
    real = real_compiler(skip=os.environ.get("ZERO_KIT_PCH_SHIM"))
    folder = os.environ.get("ZERO_KIT_PCH_DIR")
    parsed = parse_compile(args) if folder else None
    if parsed is None or not includes_header(real, parsed[0], parsed[1]):
        os.execv(real, [real, *args])
    flags, source, depfile = parsed
    header = precompiled_header(real, flags, Path(folder))
    if header is None:
        os.execv(real, [real, *args])
    at = args.index("-c")
    done = subprocess.run([real, *args[:at], "-include", str(header), *args[at:]])
    if done.returncode == 0 and depfile:
        drop_from_depfile(depfile, header)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
