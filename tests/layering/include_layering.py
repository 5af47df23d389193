#!/usr/bin/env python3
"""Checks the direction of #include between the folders of src/ and include/hpctrain/ against the layers that
docs/design.md documents (its ```layers block: one line per layer, top first). A file may include its own folder and
the folders of lower layers, never a folder on its own line or above. Every wrong-way include is reported with file,
line and the rule it breaks, and the test fails.

Usage: include_layering.py SOURCE_DIR. Before the real tree it checks a small tree with planted wrong-way includes, so
a checker that finds nothing cannot pass."""
import pathlib
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')

# Wrong-way includes waiting for a rewrite in another branch, each with why it is still here. Reported on every run;
# remove an entry as soon as its include is gone (an entry that matches nothing fails the test).
ALLOWED = {
    # "src/FOLDER/FILE.cpp: hpctrain/OTHER/HEADER.hpp": "why",
}


def read_layers(design):
    text = design.read_text()
    match = re.search(r"```layers\n(.*?)```", text, re.S)
    if not match:
        sys.exit(f"{design}: no ```layers block (the layering this test checks)")
    layers = {}
    lines = [line.split("#")[0].split() for line in match.group(1).splitlines()]
    lines = [folders for folders in lines if folders]
    for height, folders in enumerate(reversed(lines)):
        for folder in folders:
            layers[folder.rstrip("/")] = height
    return layers, " > ".join(" ".join(f.rstrip("/") for f in folders) for folders in lines)


def folder_of(root, path):
    """The top folder of a file under src/ or include/hpctrain/, or None."""
    relative = path.relative_to(root).parts
    if relative[0] == "src" and len(relative) > 2:
        return relative[1]
    if relative[:2] == ("include", "hpctrain") and len(relative) > 3:
        return relative[2]
    return None


def included_folder(root, path, name):
    if name.startswith("hpctrain/"):
        parts = name.split("/")
        return parts[1] if len(parts) > 2 else None
    resolved = (path.parent / name).resolve()  # a relative include: where it lands
    if resolved.exists() and resolved.is_relative_to(root.resolve()):
        return folder_of(root.resolve(), resolved)
    return None


def check(root):
    """(violations, allowed ones used, layer text) for the tree at root."""
    layers, order = read_layers(root / "docs" / "design.md")
    violations, used = [], set()
    files = sorted(p for top in ("src", "include/hpctrain") for p in (root / top).rglob("*")
                   if p.suffix in (".cpp", ".hpp", ".h", ".cu", ".cuh"))
    for path in files:
        source = folder_of(root, path)
        if source is None:
            continue
        where = path.relative_to(root)
        if source not in layers:
            violations.append(f"{where}: folder {source}/ is not in the layers of docs/design.md ({order}); add it")
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target = included_folder(root, path, match.group(1))
            if target is None or target == source:
                continue
            if target not in layers:
                violations.append(f"{where}:{number}: includes {match.group(1)}: folder {target}/ is not in the layers "
                                  f"of docs/design.md ({order})")
            elif layers[target] >= layers[source]:
                key = f"{where}: {match.group(1)}"
                if key in ALLOWED:
                    used.add(key)
                    continue
                relation = "on the same layer as" if layers[target] == layers[source] else "above"
                violations.append(f"{where}:{number}: includes {match.group(1)}: {source}/ may not include "
                                  f"{target}/, which is {relation} it (docs/design.md: {order})")
    return violations, used, order


def self_test():
    """A tree with one include of each wrong kind: the checker must find exactly those."""
    with tempfile.TemporaryDirectory() as directory:
        root = pathlib.Path(directory)
        (root / "docs").mkdir()
        (root / "docs" / "design.md").write_text("```layers\ntrain\nnn data\nio\ncore\n```\n")
        files = {
            "src/io/good.cpp": '#include "hpctrain/core/error.hpp"\n#include "hpctrain/io/good.hpp"\n',
            "src/io/upward.cpp": '#include <vector>\n#include "hpctrain/nn/model.hpp"\n',
            "src/nn/sideways.cpp": '#include "hpctrain/data/batch.hpp"\n',
            "src/io/relative.cpp": '#include "../train/private.hpp"\n',
            "src/train/private.hpp": "",
            "include/hpctrain/core/upward.hpp": '#  include "hpctrain/io/file.hpp"\n',
        }
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        violations, _, _ = check(root)
        found = sorted(v.split(":")[0] for v in violations)
        expected = sorted(["include/hpctrain/core/upward.hpp", "src/io/relative.cpp", "src/io/upward.cpp",
                           "src/nn/sideways.cpp"])
        if found != expected:
            sys.exit("self-test failed: the checker found\n  " + "\n  ".join(violations) + f"\nexpected {expected}")


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    self_test()
    violations, used, order = check(root)
    for key in sorted(used):
        print(f"allowed for now: {key} ({ALLOWED[key]})")
    for key in sorted(set(ALLOWED) - used):
        violations.append(f"allow-list entry '{key}' matches no include: remove it from {pathlib.Path(__file__).name}")
    for violation in violations:
        print(violation, file=sys.stderr)
    if violations:
        sys.exit(f"{len(violations)} include(s) against the layers")
    print(f"includes follow the layers {order}")


if __name__ == "__main__":
    main()
