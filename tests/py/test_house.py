"""House rules checked from the package's source (see /work/shared/design/style.md: one home per fact)."""
import ast
from pathlib import Path

import loopfuse

PACKAGE = Path(loopfuse.__file__).parent


def _attributes(path: Path) -> set[str]:
    """The attribute names module `path` reads (``jax.tree_util.keystr`` reads ``keystr``)."""
    tree = ast.parse(path.read_text(), str(path))
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    return names | {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}


def test_leaf_paths_are_spelled_by_leaves_only():
    """A leaf's path is written `leaves.keyed` or `leaves.dotted`, never by jax's keystr elsewhere."""
    spelling = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "leaves.py" and "keystr" in _attributes(p))
    assert not spelling, f"modules calling jax.tree_util.keystr (use leaves.keyed / keyed_paths): {spelling}"
    assert "keystr" in _attributes(PACKAGE / "leaves.py")      # the check sees the one that does
