"""README.md says what the code does: its python blocks run, and every name it documents exists.

The python blocks run in order in one namespace (like a reader pasting them into one session), each
after its preamble below, which supplies what the README leaves to the reader (a model, its data).
"""
import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

import loopfuse

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PACKAGE = Path(loopfuse.__file__).parent
# module file name -> its dotted path (loopfuse's subpackages hold modules of distinct names)
MODULES = {p.stem: "loopfuse." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
           for p in PACKAGE.rglob("*.py") if p.stem != "__init__" and "passes" not in p.relative_to(PACKAGE).parts}

# What each python block (in README order) needs from the reader, and the claims its comments make.
PREAMBLES = [
    """
import numpy as np, jax.numpy as jnp
rng = np.random.default_rng(0)
X = rng.normal(size=(512, 8)).astype(np.float32)
Y = X @ rng.normal(size=(8, 1)).astype(np.float32)
params = {"w": jnp.zeros((8, 1)), "b": jnp.zeros(1)}
batch = {"x": X[:128], "y": Y[:128]}
def loss_fn(params, batch):
    return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)
""",
    "state = result.state                  # the state the block above ends with",
    """
import transformer                       # a GPT-style model written as a Python loop over its blocks
gpt_step, gpt_state, tokens = transformer.gpt(**transformer.TINY)
""",
    "state = jax.tree.map(jnp.copy, result.state)   # a copy: the step below consumes it",
    "gpt_step, gpt_state, tokens = transformer.gpt(**dict(transformer.TINY, layers=2, seq=64, batch=16))",
    "state = result.state                  # the packing block leaves it intact (pack copies)",
    "loss, params = loss_fn, state[0]",
    "",                                   # continues the block above (loss, params, batch, minimize)
    """
starts = jax.tree.map(lambda x: jnp.stack([x + 0.1 * i for i in range(4)]), params)   # 4 members
states = jax.vmap(lambda p: (p, opt.init(p)))(starts)
""",
]
CLAIMS = [
    'assert aux["loss"].shape == (100,) and result.steps == 10_000 and result.history["loss"].shape == (10_000,)',
    'assert aux["loss"].shape == (10,) and jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(state[0])',
    'assert rolled.compiled(packed, tokens).reports["roll-layers"].startswith("rolled") and aux["loss"] > 0',
    'assert step.compiled(state, batch).reports["micro-batch"].startswith("micro-batched into 4 slices")',
    'assert limited.compiled(gpt_state, tokens).memory.peak <= 4 << 20 < limited.compiled(gpt_state, tokens)'
    '.memory_plan.traced_peak',
    'assert 1 <= int(steps) <= 1000 and losses.shape == (int(steps),) and aux["loss"].shape == (1000,)',
    "assert sol.loss_history.shape == (2000,) and sol.steps == 2000 and sol.steps_per_second > 0",
    'assert sol.retcode == "converged" and sol.steps < 200',
    'assert sol.steps.shape == (4,) and best["w"].shape == (8, 1) and result.steps.shape == (4,)',
]

# CamelCase names the README mentions that are neither `loopfuse.X` nor listed with their module in
# its Layout section: where each lives.
OTHER_HOMES = {"CheckpointManager": "orbax.checkpoint", "ModulePass": "loopfuse.passes.module_pass",
               "TypeError": "builtins", "ValueError": "builtins", "None": "builtins", "FloatingPointError": "builtins",
               "GradientTransformationExtraArgs": "optax"}
# what `name.attr` refers to in the README's prose
OWNERS = {"step": "Step", "result": "FitResult", "FitResult": "FitResult", "sol": "Solution", "Solution": "Solution"}
# callables whose keyword arguments the README documents
CALLABLES = {"compile_step": "compile_step", "fit": "fit", "minimize": "minimize", "loop": "Step.loop",
             "Dataset": "Dataset", "GradOnly": "GradOnly", "CompiledStep": "CompiledStep",
             "CompiledLoop": "CompiledLoop"}


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)


def _spans(text: str) -> list[str]:
    """Inline code spans (they may wrap a line) and the bodies of fenced and indented code blocks."""
    fenced = re.findall(r"^```\w*\n(.*?)^```$", text, re.S | re.M)
    indented = ["\n".join(line[4:] for line in block.splitlines())
                for block in re.findall(r"(?:^ {4}\S.*\n(?: {4,}.*\n)*)", text, re.M)]
    prose = re.sub(r"^```\w*\n.*?^```$", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`]+)`", prose) + fenced + indented


def _resolve(dotted: str):
    """The object `dotted` names inside loopfuse ("Step.loop", "xla.SPLIT_ALL_REDUCE_BYTES": a module may be
    named by its file's name alone, as the prose does)."""
    obj = loopfuse
    for part in dotted.split("."):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif obj is loopfuse and part in MODULES:
            obj = importlib.import_module(MODULES[part])
        else:
            obj = importlib.import_module(f"{obj.__name__}.{part}")
    return obj


def _documented_names(text: str) -> set[str]:
    """The names the README documents, as dotted paths to check (``loopfuse.``-relative where public)."""
    names = {m for m in re.findall(r"\bloopfuse\.(\w+(?:\.\w+)*)", text)}
    for span in _spans(text):
        names |= {m for m in re.findall(r"^([A-Z][a-z]\w*)(?:\(\))?$", span)}
        names |= {f"xla.{m}" for m in re.findall(r"\bxla\.([A-Z_]+)\b", span)}
        names |= {f"{OWNERS[o]}.{a}" for o, a in re.findall(r"\b(\w+)\.(\w+)\b", span) if o in OWNERS and a != "py"}
    return names


def _layout_homes(text: str) -> dict[str, str]:
    """name -> module for the README's "`folder/module.py` (`name`, ...)" entries (its Layout section; a
    description may follow the names after a colon)."""
    entries = re.findall(r"`([\w/]+)\.py`\s+\((`\w+`(?:,\s+`\w+`)*)(?::[^)]*)?\)", text)
    return {name: "loopfuse." + module.replace("/", ".") for module, names in entries
            for name in re.findall(r"`(\w+)`", names)}


def _exists(name: str) -> bool:
    homes = {**OTHER_HOMES, **_layout_homes(README)}
    if name in homes and not hasattr(loopfuse, name):
        return hasattr(importlib.import_module(homes[name]), name)
    owner, _, attr = name.rpartition(".")
    try:
        obj = _resolve(owner) if owner else loopfuse
    except (AttributeError, ImportError):
        return False
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and attr in {f.name for f in dataclasses.fields(obj)}:
        return True
    if obj is loopfuse.Step and hasattr(loopfuse.compile_step(lambda state, batch: (state, {})), attr):
        return True           # instance attributes (compile_count)
    try:
        _resolve(name)
        return True
    except (AttributeError, ImportError):
        return False


def _documented_keywords(text: str) -> set[tuple[str, str]]:
    """(callable, keyword) for every call of a `CALLABLES` entry in the README's code that parses."""
    found = set()
    for span in _spans(text):
        try:
            tree = ast.parse(span.strip())
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                found |= {(func, kw.arg) for kw in node.keywords if func in CALLABLES and kw.arg}
    return found


def test_every_documented_name_exists():
    names = _documented_names(README)
    assert {"AuxPathError", "CacheWarning", "PipelineError", "FitResult.retcode", "Step.memory_stats",
            "xla.SPLIT_ALL_REDUCE_BYTES", "compile_step", "passes"} <= names          # the scan sees them
    missing = sorted(n for n in names if not _exists(n))
    assert not missing, f"README.md documents names loopfuse does not have: {missing}"


def test_every_documented_keyword_is_accepted():
    keywords = _documented_keywords(README)
    assert {("compile_step", "xla_options"), ("fit", "checkpoint_every"), ("minimize", "until"),
            ("loop", "stop_on_nonfinite"), ("CompiledLoop", "sharding")} <= keywords
    unknown = sorted((f, kw) for f, kw in keywords
                     if kw not in inspect.signature(_resolve(CALLABLES[f])).parameters)
    assert not unknown, f"README.md documents keyword arguments that are not accepted: {unknown}"


def test_every_compile_step_keyword_is_documented():
    from loopfuse.compile.options import KEYWORDS
    assert not [k for k in KEYWORDS if not re.search(rf"`{k}[`=]", README)]


@pytest.mark.parametrize("backend", ["GradOnly", "CompiledStep", "CompiledLoop"])
def test_each_backend_takes_ad(backend):
    """README: "Each takes `ad=Reverse()` or `ad=Forward()`"."""
    assert "Each takes `ad=Reverse()` or `ad=Forward()`" in README
    cls = getattr(loopfuse, backend)
    assert cls(ad=loopfuse.Forward()).ad == loopfuse.Forward() and cls(ad=loopfuse.Reverse()).ad == loopfuse.Reverse()


def test_the_layout_names_each_modules_definitions():
    homes = _layout_homes(README)
    assert {"compile_step", "Executable", "fit", "minimize"} <= set(homes)
    assert not sorted(n for n, m in homes.items() if not hasattr(importlib.import_module(m), n))


def test_documented_files_exist():
    files = {s for s in _spans(README) if re.fullmatch(r"[\w/]+\.py", s)}
    assert {"compile/trace.py", "module_pass.py", "tests/py/test_multihost.py"} <= files
    homes = (ROOT, PACKAGE, ROOT / "passes", *(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()))
    assert not sorted(f for f in files if not any((home / f).is_file() for home in homes))


def test_python_blocks_run():
    blocks = _python_blocks(README)
    assert len(blocks) == len(PREAMBLES) == len(CLAIMS), "give each README python block a preamble and its claims"
    namespace: dict = {}
    for i, (preamble, block, claims) in enumerate(zip(PREAMBLES, blocks, CLAIMS)):
        exec(compile(preamble, f"<preamble {i}>", "exec"), namespace)
        exec(compile(block, f"<README.md python block {i}>", "exec"), namespace)
        exec(compile(claims, f"<claims of block {i}>", "exec"), namespace)
