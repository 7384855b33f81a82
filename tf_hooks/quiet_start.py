"""A quiet start beside the ``[xla-gpu]`` extra. Its JAX CUDA plugin (there for deviceless
XLA:GPU compiles) cannot initialize on a machine without an NVIDIA driver: JAX prints
"Unable to load CUDA" tracebacks before falling back to the CPU, and each of the plugin's
native libraries prints a ``cudart_stub`` line when it is loaded. At start-up (the .pth
line), with that plugin installed and no NVIDIA driver, ``JAX_PLATFORMS`` defaults to
``cpu`` (a value the user set is kept; the deviceless compiler works under ``cpu``), and the
plugin's modules load with fd 2 captured: everything else written there meanwhile is passed
on, in order; only the plugin's own "could not find cuda drivers" lines are dropped.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys

NVIDIA_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl")
CUDA_PLUGIN_PACKAGES = ("jax_plugins.xla_cuda12", "jax_cuda12_plugin")
# absl's preamble line comes before the first log line of a process; it is dropped only
# directly before a dropped line.
_ABSL_PREAMBLE = b"WARNING: All log messages before absl::InitializeLog() is called are " \
                 b"written to STDERR"
_NO_DRIVER_LINE = re.compile(rb"^I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find "
                             rb"cuda drivers on your machine, GPU will not be used\.$")


def at_start_up(environ=os.environ) -> None:
    """Both quietings, where the CUDA plugin can only fail."""
    if any(map(os.path.exists, NVIDIA_DRIVER_FILES)) or not _installed(CUDA_PLUGIN_PACKAGES[0]):
        return
    default_jax_platforms(environ)
    if hasattr(os, "memfd_create") and not any(isinstance(f, QuietCudaPluginFinder)
                                               for f in sys.meta_path):
        sys.meta_path.insert(0, QuietCudaPluginFinder())


def default_jax_platforms(environ=os.environ) -> bool:
    """Set ``JAX_PLATFORMS=cpu`` where the CUDA plugin can only fail; True when it did."""
    if "JAX_PLATFORMS" in environ or any(map(os.path.exists, NVIDIA_DRIVER_FILES)):
        return False
    if not _installed(CUDA_PLUGIN_PACKAGES[0]) or _installed("libtpu"):
        return False
    environ["JAX_PLATFORMS"] = "cpu"
    return True


def drop_no_driver_lines(captured: bytes) -> bytes:
    """``captured`` without the plugin's no-driver lines (and absl's preamble to them)."""
    lines = captured.splitlines(keepends=True)
    kept = []
    for i, line in enumerate(lines):
        if _NO_DRIVER_LINE.match(line.rstrip(b"\r\n")):
            continue
        following = lines[i + 1].rstrip(b"\r\n") if i + 1 < len(lines) else b""
        if line.rstrip(b"\r\n") == _ABSL_PREAMBLE and _NO_DRIVER_LINE.match(following):
            continue
        kept.append(line)
    return b"".join(kept)


class QuietStderr:
    """fd 2 goes to a memory file for the block; what was written there comes back to the
    real fd 2 afterwards, less the no-driver lines. Does nothing if fd 2 is not open."""

    def __enter__(self):
        self.saved = None
        try:
            sys.stderr.flush()
        except (AttributeError, OSError, ValueError):
            pass
        try:
            self.saved = os.dup(2)
        except OSError:
            return self
        self.capture = os.memfd_create("fusionstitching-quiet-start")
        os.dup2(self.capture, 2)
        return self

    def __exit__(self, *exc_info):
        if self.saved is None:
            return False
        try:
            sys.stderr.flush()
        except (AttributeError, OSError, ValueError):
            pass
        os.dup2(self.saved, 2)
        os.close(self.saved)
        os.lseek(self.capture, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(self.capture, 1 << 16):
            chunks.append(chunk)
        os.close(self.capture)
        passed_on = drop_no_driver_lines(b"".join(chunks))
        while passed_on:
            passed_on = passed_on[os.write(2, passed_on):]
        return False


class QuietCudaPluginFinder:
    """A meta-path finder that loads the CUDA plugin's modules through ``QuietLoader``."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(CUDA_PLUGIN_PACKAGES):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, QuietLoader):
                    spec.loader = QuietLoader(spec.loader)
                return spec
        return None


class QuietLoader:
    """Loads a module with ``QuietStderr``; the JAX plugin's ``initialize`` runs in it too."""

    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # resource readers and the like: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec):
        with QuietStderr():
            return self.loader.create_module(spec)

    def exec_module(self, module):
        with QuietStderr():
            self.loader.exec_module(module)
        initialize = getattr(module, "initialize", None)
        if module.__name__ == CUDA_PLUGIN_PACKAGES[0] and callable(initialize):
            def quiet_initialize(*args, **kwargs):
                with QuietStderr():
                    return initialize(*args, **kwargs)
            module.initialize = quiet_initialize


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or half-installed package: not ours to judge
        return False
