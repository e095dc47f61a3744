"""lit configuration: every .mlir file here is a loopfuse-opt | filecheck test."""
import os
import sys

import lit.formats

config.name = "loopfuse"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)

for var in ("JAX_PLATFORMS", "XLA_FLAGS", "PYTHONPATH", "HOME", "PATH"):
    if var in os.environ:
        config.environment[var] = os.environ[var]

# Run the tools with the Python running lit, so a venv needs no activation.
config.substitutions.append(("loopfuse-opt", f"{sys.executable} -m loopfuse.diagnostics.opt"))
config.substitutions.append(("filecheck", f"{sys.executable} -m filecheck"))
