#!/usr/bin/env python3
"""Compiles kernel sources with hiprtc (the library the ROCm backend will use
at run time) for each given architecture, one program object per source and
architecture, with FMA contraction off (the match of NVRTC's --fmad=false).
Needs no GPU. Prints one line per compilation and ends with `N passed, N
failed`; exits non-zero on a failure. Used by .ci/rocm-sid-chroot.

    python3 rocm_hiprtc.py --arch gfx942 --arch gfx950 DIR_OF_SOURCES
"""
import argparse
import ctypes
import os
import sys


def load():
    for name in ("libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6"):
        try:
            return ctypes.CDLL(name), name
        except OSError:
            continue
    sys.exit("hiprtc not found (libhiprtc.so, .7, .6)")


def compile_one(rtc, src, name, arch):
    prog = ctypes.c_void_p()
    rc = rtc.hiprtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None)
    if rc != 0:
        return False, f"hiprtcCreateProgram returned {rc}"
    opts = [f"--offload-arch={arch}", "-O3", "-std=c++17", "-ffp-contract=off"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    rc = rtc.hiprtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    rtc.hiprtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value + 1)
    rtc.hiprtcGetProgramLog(prog, log)
    code = b""
    if rc == 0:
        n = ctypes.c_size_t()
        rtc.hiprtcGetCodeSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        rtc.hiprtcGetCode(prog, buf)
        code = buf.raw
    rtc.hiprtcDestroyProgram(ctypes.byref(prog))
    if rc != 0:
        first = next((l for l in log.value.decode(errors="replace").splitlines() if "error" in l), "")
        return False, f"hiprtcCompileProgram returned {rc}: {first}"
    # The code object names the processor it was built for.
    if arch.encode() not in code:
        return False, f"the code object does not name {arch}"
    return True, f"{len(code)} bytes of code object for {arch}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", action="append", required=True)
    ap.add_argument("dir", help="a directory of assembled kernel sources (*.cu)")
    a = ap.parse_args()
    rtc, lib = load()
    files = sorted(f for f in os.listdir(a.dir) if f.endswith((".cu", ".hip")))
    if not files:
        sys.exit(f"no kernel sources in {a.dir}")
    passed = failed = 0
    for f in files:
        src = open(os.path.join(a.dir, f)).read()
        for arch in a.arch:
            ok, msg = compile_one(rtc, src, f, arch)
            print(f"{'PASS' if ok else 'FAIL'} {f} {arch} ({lib}): {msg}", flush=True)
            passed += ok
            failed += not ok
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
