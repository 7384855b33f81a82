import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop

# Started by Python at every start-up: it does nothing unless FUSIONSTITCHING is set (tf_hooks).
HOOK_PTH = os.path.join("tf_hooks", "site", "fusionstitching_hook.pth")


class BuildPyWithHook(build_py):
    """Also put the FUSIONSTITCHING start-up hook (.pth) at the root of site-packages: into
    build_lib for wheels, and into the editable wheel itself for ``pip install -e`` (whose
    build_lib is thrown away)."""

    def run(self):
        super().run()
        root = self.get_finalized_command("install").install_lib if self.editable_mode \
            else self.build_lib
        self.copy_file(HOOK_PTH, os.path.join(root, os.path.basename(HOOK_PTH)))


class DevelopWithHook(develop):
    """The same for legacy editable installs (``setup.py develop``: what pip runs for
    ``pip install -e`` without build isolation)."""

    def run(self):
        super().run()
        self.copy_file(HOOK_PTH, os.path.join(self.install_dir, os.path.basename(HOOK_PTH)))


setup(
    name="fusionstitching",
    version="0.2.0",
    description="FusionStitching: a post-XLA pass that stitches memory-intensive fusions "
                "into larger kernels (registers, warp shuffles, shared memory)",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["fusionstitching", "fusionstitching.*", "costmodel",
                                    "costmodel.*", "tf_hooks", "tf_hooks.*"]),
    package_data={"costmodel": ["data/*"]},
    install_requires=[
        "jax>=0.10,<0.11",
        "jaxlib>=0.10,<0.11",
        "llvmlite>=0.50,<0.51",
        "numpy>=1.26",
        "networkx>=3.0",
    ],
    extras_require={
        "tf": ["tensorflow-cpu>=2.21,<2.22"],
        # ptxas for cubins and register counts; cuda-python for a GPU launcher.
        "cuda": ["nvidia-cuda-nvcc-cu12>=12.4", "cuda-python>=12.4"],
        # XLA:GPU deviceless compilation (capture of XLA:GPU's optimized HLO without a GPU).
        "xla-gpu": ["jax-cuda12-plugin>=0.10,<0.11", "jax-cuda12-pjrt>=0.10,<0.11",
                    "nvidia-cuda-nvcc-cu12>=12.4"],
        # replay --ray: modules planned as tasks on a Ray cluster; --remote_cache=redis://...
        "cluster": ["ray>=2.50", "redis>=5"],
        # benchmarks/script_runs.py: the flax training scripts
        "bench": ["flax>=0.10", "optax>=0.2"],
        # The tests exercise TF capture, XLA:GPU's deviceless compiler (plans and PTX),
        # replay on a Ray cluster they start and the remote cache on a redis-server they start.
        "test": ["pytest>=8", "ruff>=0.6", "tensorflow-cpu>=2.21,<2.22",
                 "jax-cuda12-plugin>=0.10,<0.11", "jax-cuda12-pjrt>=0.10,<0.11",
                 "nvidia-cuda-nvcc-cu12>=12.4", "ray>=2.50", "redis>=5"],
    },
    entry_points={"console_scripts": ["fusionstitching=fusionstitching.cli:main"]},
    cmdclass={"build_py": BuildPyWithHook, "develop": DevelopWithHook},
)
