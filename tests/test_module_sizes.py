"""Modules stay small enough to read in one sitting: a module that outgrows its limit
holds more than one concept, and splits where its concepts part. And no module takes
part in an import circle, so each can be read with only what it stands on."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "hetero_infer"
# The product's packages, each a folder here (hetero_infer.engine is engine/).
PRODUCT_PACKAGES = ("engine", "server", "kernels")
MAX_LINES = {"engine": 300, "server": 400, "kernels": 450}
# The C++ kernels (kernels/csrc): a file per kernel, its shared parts in headers.
MAX_CPP_LINES = 600


@pytest.mark.parametrize("package", sorted(MAX_LINES))
def test_no_module_outgrows_its_package_limit(package: str):
    limit = MAX_LINES[package]
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for path in (ROOT / package).rglob("*.py")
    }
    assert sizes, f"no modules found under {package}/"
    too_long = {name: lines for name, lines in sizes.items() if lines > limit}
    assert not too_long, f"over {limit} lines: {too_long}"


def test_no_cpp_kernel_file_outgrows_the_limit():
    sizes = {
        path.name: len(path.read_text().splitlines())
        for path in (ROOT / "kernels" / "csrc").iterdir()
        if path.suffix in (".cpp", ".h")
    }
    assert sizes, "no C++ kernels found"
    too_long = {name: lines for name, lines in sizes.items() if lines > MAX_CPP_LINES}
    assert not too_long, f"over {MAX_CPP_LINES} lines: {too_long}"


def product_modules() -> dict[str, Path]:
    """Every product module's file by its dotted name; a package's __init__.py (its
    facade) is a module named as the package."""
    modules = {}
    for folder in PRODUCT_PACKAGES:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((PACKAGE, *parts))] = path
    return modules


def imported_names(path: Path, module: str) -> set[str]:
    """The dotted names a module imports, anywhere in it: type-only imports under
    ``if TYPE_CHECKING:`` and those inside functions count, as each still ties the two
    modules together for a reader. ``from X import name`` gives X, whose facade it reads
    the name from, and X.name, which may be a submodule; a relative import is made
    absolute."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                # One dot is the module's own package (a facade is its own package).
                package = module.split(".")
                if path.name != "__init__.py":
                    package = package[:-1]
                package = package[: len(package) - (node.level - 1)]
                source = ".".join(package + [source] if source else package)
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    """Each product module -> the product modules it imports: each imported name taken
    to the longest module name it starts with (a class's name to its module's)."""
    modules = product_modules()

    def module_of(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None  # None: not the product's (the standard library, torch)

    graph = {}
    for module, path in modules.items():
        imported = {module_of(name) for name in imported_names(path, module)}
        graph[module] = imported - {None, module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module: the modules that each
    import, directly or through the others, one that imports them back. Tarjan's
    algorithm, with a stack of its own rather than recursion, as import chains can run
    deeper than Python's recursion limit."""
    reached: dict[str, int] = {}  # the order modules were first reached in
    lowest: dict[str, int] = {}  # the earliest module on the stack each one reaches
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    # The modules being walked, each with the imports it has still to follow.
    walk: list[tuple[str, Iterator[str]]] = []

    def reach(module: str) -> None:
        reached[module] = lowest[module] = len(reached)
        stack.append(module)
        on_stack.add(module)
        walk.append((module, iter(sorted(graph[module]))))

    for root in sorted(graph):
        if root in reached:
            continue
        reach(root)
        while walk:
            module, imported = walk[-1]
            for other in imported:
                if other not in reached:
                    reach(other)
                    break
                if other in on_stack:
                    lowest[module] = min(lowest[module], reached[other])
            else:  # every import followed: the module is done
                walk.pop()
                if walk:
                    importer = walk[-1][0]
                    lowest[importer] = min(lowest[importer], lowest[module])
                if lowest[module] == reached[module]:  # it heads a component: pop it
                    component = []
                    while not component or component[-1] != module:
                        component.append(stack.pop())
                        on_stack.discard(component[-1])
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_no_module_takes_part_in_an_import_circle():
    graph = import_graph()
    assert any(graph.values()), "no imports found between the product's modules"

    def short(module: str) -> str:
        return module.removeprefix(f"{PACKAGE}.")

    def edges(circle: list[str]) -> str:
        """Each module of the circle -> the ones of it that it imports."""
        return "; ".join(
            f"{short(module)} -> {', '.join(short(m) for m in sorted(graph[module] & set(circle)))}"
            for module in circle
        )

    circles = "\n".join(edges(circle) for circle in import_circles(graph))
    assert not circles, f"modules in import circles:\n{circles}"
