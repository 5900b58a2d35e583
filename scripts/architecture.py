"""The room and arrow picture of src/ (issues 27 and 40): modules, lines, the project's own import arrows, cycles,
imports inside functions, which modules read a DictConfig or import omegaconf/hydra, the modules at the package
root, the folders (rooms) and the arrows and loops between them, and functions over 50 lines.

  python scripts/architecture.py [--src src/ttp_lightning] [--json out.json] [--list]

A room is a folder directly under the package (a module at the root is a room of its own); an arrow between
rooms is any arrow between their modules, and a folder loop is a strongly connected set of rooms.

An arrow A -> B is an import of B written in A (`import ttp_lightning.b`, `from ttp_lightning.b import x`,
`from ttp_lightning import b` when b is a module, and relative imports). A cycle is a strongly connected set
of modules over all arrows, those written inside functions included (they run as soon as the function does).
"""

import argparse
import ast
import json
from pathlib import Path

PACKAGE = "ttp_lightning"
CONFIG_NAMES = {"DictConfig", "OmegaConf", "ListConfig"}
FRAMEWORKS = ("omegaconf", "hydra")
LONG = 50  # a function of more lines than this (its def to its last line) is long


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, here: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(node, here: str, is_package: bool, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        origin = _resolve(node, here, is_package)
        names = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin for alias in node.names]
    found = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name.startswith(PACKAGE) and name != here:
            found.append(name)
    return found


def _inside_function(tree: ast.AST) -> set[int]:
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner.update(id(child) for child in ast.walk(node) if isinstance(child, (ast.Import, ast.ImportFrom)))
    return inner


def scan(src: Path) -> dict:
    paths = sorted(src.rglob("*.py"))
    modules = {module_name(path, src): path for path in paths}
    arrows, late, late_project, config_readers, lines = {}, 0, [], [], {}
    framework_importers, long_functions = set(), []
    for name, path in modules.items():
        text = path.read_text()
        lines[name] = len(text.splitlines())
        tree = ast.parse(text)
        inner = _inside_function(tree)
        arrows[name] = set()
        reads_config = False
        long_functions.extend(f"{name}.{node.name} ({node.end_lineno - node.lineno + 1} lines)"
                              for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                              and node.end_lineno - node.lineno + 1 > LONG)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if _imports_framework(node):
                framework_importers.add(name)
            targets = _targets(node, name, path.name == "__init__.py", set(modules))
            arrows[name].update(targets)
            if id(node) in inner:
                late += 1
                late_project.extend(f"{name} -> {target}" for target in targets)
            if isinstance(node, ast.ImportFrom) and any(alias.name in CONFIG_NAMES for alias in node.names):
                reads_config = True
        if reads_config:
            config_readers.append(name)
    cycles = [sorted(group) for group in strongly_connected(arrows) if len(group) > 1]
    room_arrows = {}
    for name, targets in arrows.items():
        room_arrows.setdefault(room_of(name), set()).update(room_of(t) for t in targets if room_of(t) != room_of(name))
    folders = sorted({room_of(name) for name in modules if name.count(".") >= 2})
    return {"root_modules": sorted(name for name, path in modules.items() if path.parent == src),
            "folders": folders,
            "room_arrows": {room: sorted(targets) for room, targets in sorted(room_arrows.items())},
            "folder_loops": [sorted(group) for group in strongly_connected(room_arrows) if len(group) > 1],
            "framework_importers": sorted(framework_importers),
            "long_functions": sorted(long_functions),
            "modules": len(modules), "lines": sum(lines.values()),
            "arrows": sum(len(targets) for targets in arrows.values()),
            "cycles": cycles, "modules_in_cycles": sum(len(group) for group in cycles),
            "function_level_imports": late, "function_level_project_imports": sorted(late_project),
            "config_readers": sorted(config_readers),
            "arrow_list": {name: sorted(targets) for name, targets in arrows.items()}}


def room_of(name: str) -> str:
    """The folder directly under the package that holds a module (or the root module itself)."""
    return ".".join(name.split(".")[:2])


def _imports_framework(node) -> bool:
    names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    return any(name.split(".")[0] in FRAMEWORKS for name in names if not getattr(node, "level", 0))


def strongly_connected(arrows: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index, low, on_stack, stack, groups, counter = {}, {}, set(), [], [], [0]
    for root, children_of_root in arrows.items():
        if root in index:
            continue
        work = [(root, iter(sorted(children_of_root)))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(arrows.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                groups.append(group)
    return groups


def room_lines(picture: dict) -> list[str]:
    """The rooms and the rooms each imports, one line each, the rooms that stand on others first (a room's
    height is the longest chain of arrows below it), the package prefix left out (docs/layout.md shows them)."""
    arrows = {room: set(targets) - {room} for room, targets in picture["room_arrows"].items()}
    height: dict[str, int] = {}

    def measure(room: str) -> int:  # the rooms have no loop (test_architecture), so the recursion ends
        if room not in height:
            height[room] = 1 + max((measure(target) for target in arrows.get(room, ())), default=-1)
        return height[room]

    def short(room: str) -> str:
        return room.removeprefix(PACKAGE + ".") if room != PACKAGE else "(package)"

    order = sorted(arrows, key=lambda room: (-measure(room), short(room)))
    return [f"{short(room):12s} -> {' '.join(sorted(short(t) for t in arrows[room])) or '(nothing)'}" for room in order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src" / PACKAGE)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--list", action="store_true", help="print every function-level project import and cycle")
    parser.add_argument("--rooms", action="store_true", help="print each room and the rooms it imports")
    args = parser.parse_args()
    picture = scan(args.src)
    print(f"modules {picture['modules']}, lines {picture['lines']}, import arrows {picture['arrows']}, "
          f"cycles {len(picture['cycles'])} ({picture['modules_in_cycles']} modules), "
          f"function-level imports {picture['function_level_imports']} "
          f"({len(picture['function_level_project_imports'])} of the project's own modules), "
          f"modules reading a DictConfig {len(picture['config_readers'])}")
    print(f"root modules {len(picture['root_modules'])}, folders {len(picture['folders'])}, "
          f"arrows between rooms {sum(len(t) for t in picture['room_arrows'].values())}, "
          f"folder loops {len(picture['folder_loops'])}, "
          f"omegaconf/hydra importers {len(picture['framework_importers'])}, "
          f"functions over {LONG} lines {len(picture['long_functions'])}")
    if args.list:
        for cycle in picture["cycles"]:
            print("cycle:", " ".join(cycle))
        for arrow in picture["function_level_project_imports"]:
            print("inside a function:", arrow)
        print("DictConfig readers:", " ".join(picture["config_readers"]))
        print("root modules:", " ".join(picture["root_modules"]))
        print("folders:", " ".join(picture["folders"]))
        for loop in picture["folder_loops"]:
            print("folder loop:", " ".join(loop))
        print("omegaconf/hydra importers:", " ".join(picture["framework_importers"]))
        for function in picture["long_functions"]:
            print("long function:", function)
    if args.rooms:
        print("\n".join(room_lines(picture)))
    if args.json:
        args.json.write_text(json.dumps(picture, indent=1))


if __name__ == "__main__":
    main()
