"""lit configuration: every .mlir file here is a loopfuse-opt | filecheck test."""
import os
import shutil
import sys

import lit.formats

config.name = "loopfuse"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["Inputs"]

for var in ("JAX_PLATFORMS", "XLA_FLAGS", "PYTHONPATH", "HOME", "PATH"):
    if var in os.environ:
        config.environment[var] = os.environ[var]

# Run the tools from the Python running lit, so a venv needs no activation.
opt = shutil.which("loopfuse-opt") or f"{sys.executable} -m loopfuse.opt"
config.substitutions.append(("loopfuse-opt", opt))
config.substitutions.append(("filecheck", f"{sys.executable} -m filecheck"))
