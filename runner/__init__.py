"""The C++ runner's Python side outside the runtime: building it (`toolchain`) and the ctypes bindings its tests
drive (`bindings`). It lives beside the sources it builds, so a clone builds its own runner; the runtime finds
the binary (dflash_et.runtime.cpp_runner.find_runner) and the host library (dflash_et.runtime.native, which builds
it on first use with `python -m runner.toolchain dflash_host`), and never imports this package."""
