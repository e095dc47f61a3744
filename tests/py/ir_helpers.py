"""IR helpers shared by the pass tests: the StableHLO reference interpreter, in a child process, and op counts.

The reference interpreter (jaxlib's ``stablehlo.eval_module``) does not raise on an op it cannot
evaluate: it calls LLVM's ``report_fatal_error``, which aborts the whole process. That is every op
outside the stablehlo and func dialects (``jnp.square`` lowers to ``chlo.square`` with jax 0.10:
"LLVM ERROR: Unsupported op: ... chlo.square"; other chlo ops, ``chlo.erf`` say, alike), the
stablehlo ops it leaves to a decomposition (``dot``, ``einsum``, ``broadcast``, ``rng_bit_generator``,
...: "is unsupported at the moment") and ``custom_call``. So `interpret` runs it in a child process
(started once, and again after an abort): an abort is an `InterpreterAbort` carrying the
interpreter's message, and the test run goes on.
"""
import atexit
import os
import pickle
import subprocess
import sys
import tempfile
from collections import Counter

import numpy as np
from jaxlib.mlir import ir
from jaxlib.mlir.dialects.stablehlo import eval_module


class InterpreterAbort(RuntimeError):
    """The reference interpreter aborted its process (an op or type it cannot evaluate)."""


def interpret(module: ir.Module, args: list) -> list[np.ndarray]:
    """Run `@main` of `module` on numpy `args` with the StableHLO reference interpreter."""
    return _Child.shared().run(str(module), [np.asarray(a) for a in args])


class _Child:
    """A process running the interpreter on the modules it is sent (see `_serve`)."""

    _shared: "_Child | None" = None

    @classmethod
    def shared(cls) -> "_Child":
        if cls._shared is None or cls._shared.proc.poll() is not None:
            cls._shared = cls()
        return cls._shared

    def __init__(self):
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr)
        atexit.register(self.close)

    def run(self, text: str, args: list) -> list[np.ndarray]:
        try:
            pickle.dump((text, args), self.proc.stdin)
            self.proc.stdin.flush()
            ok, value = pickle.load(self.proc.stdout)
        except (EOFError, BrokenPipeError):
            code = self.proc.wait()
            self.stderr.seek(0)
            message = self.stderr.read().decode(errors="replace").strip()[-2000:]
            raise InterpreterAbort(f"the StableHLO reference interpreter aborted (exit code {code}): {message}") from None
        if not ok:
            raise RuntimeError(f"the StableHLO reference interpreter raised {value}")
        return value

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


def _serve() -> None:
    """The child: read (module text, args) pickles, answer (True, results) or (False, the error)."""
    from loopfuse.compile.mlir_context import parse_module
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                      # what the interpreter prints goes to stderr, not into the replies
    while True:
        try:
            text, args = pickle.load(sys.stdin.buffer)
        except EOFError:
            return
        module = parse_module(text)
        try:
            with module.context:
                reply = True, [np.array(r) for r in eval_module(module, [ir.DenseElementsAttr.get(a) for a in args])]
        except Exception as e:  # noqa: BLE001 (sent back to the test, which raises it)
            reply = False, f"{type(e).__name__}: {e}"
        pickle.dump(reply, replies)
        replies.flush()


def lit_cases(path) -> list[tuple[str, str]]:
    """The cases of lit file `path` (split at ``// -----``), each (as written, its module text without the
    comment lines: RUN and CHECK lines, prose)."""
    return [(case, "\n".join(line for line in case.splitlines() if not line.startswith("//")))
            for case in path.read_text().split("// -----")]


def op_counts(module: ir.Module) -> Counter:
    """How many ops of each name the module holds (nested regions included)."""
    counts = Counter()

    def visit(op):
        counts[op.name] += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return counts


def concatenates(module: ir.Module) -> tuple[int, int]:
    """(how many concatenate trees the module holds: concatenates whose result no concatenate reads,
    the most operands of one concatenate)."""
    concats = []

    def visit(op):
        if op.name == "stablehlo.concatenate":
            concats.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    roots = [c for c in concats if all(u.owner.name != "stablehlo.concatenate" for u in c.result.uses)]
    return len(roots), max((len(c.operands) for c in concats), default=0)


if __name__ == "__main__":
    _serve()
