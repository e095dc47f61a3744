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
    spelling = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                      if p.name != "leaves.py" and "keystr" in _attributes(p))
    assert not spelling, f"modules calling jax.tree_util.keystr (use leaves.keyed / keyed_paths): {spelling}"
    assert "keystr" in _attributes(PACKAGE / "state" / "leaves.py")      # the check sees the one that does


def test_the_drivers_ask_once_whether_they_run_an_ensemble():
    """`minimize` and `fit` run one path: their ``ensemble=`` argument is read once, by `ensemble.wrapper`,
    and nothing else of `ensemble` is named in them (minimize tested it six times, fit branched too)."""
    import inspect

    from loopfuse.drivers import ensemble, fitting, solve
    for driver in (solve.minimize, fitting.fit):
        body = ast.parse(inspect.getsource(driver)).body[0].body
        names = [n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)]
        assert names.count("ensemble") == 1 and "wrapper" in names, driver.__name__
        own = {n for n in names if getattr(getattr(ensemble, n, None), "__module__", None) == ensemble.__name__}
        assert own == {"wrapper"}, driver.__name__
