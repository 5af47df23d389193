#!/usr/bin/python3
"""Extract the commands a reader can copy from README.md and docs/*.md, for tests/cli/docs_commands.sh.

    doc_commands.py SOURCE_DIR OUT_DIR

Writes one file per code block into OUT_DIR: NNN.sh (```bash/```sh blocks, and the `$ `-prefixed lines of unlabelled
blocks; backslash continuations joined, one command per line) or NNN.py (```python blocks). The first line of each is
a comment naming the source file and line. Also writes OUT_DIR/synopses: one line per inline `hpctrain COMMAND [SUB]`
mention (file:line, then the words), which the test checks against the program's --help.
"""
import glob
import os
import re
import sys

SHELL = {"bash", "sh", "shell", "console"}
SYNOPSIS = re.compile(r"`(?:mpiexec -n \w+ )?hpctrain ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)[^`]*`")


def blocks(path):
    """(first line number, language, lines) of each fenced block."""
    language, start, body = None, 0, []
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        fence = re.match(r"^```(\w*)", line)
        if fence and language is None:
            language, start, body = fence.group(1), number + 1, []
        elif line.startswith("```") and language is not None:
            yield start, language, body
            language = None
        elif language is not None:
            body.append(line.rstrip("\n"))


def shell_commands(language, lines):
    if language not in SHELL:  # unlabelled block: only the `$ ` lines are commands, the rest is output
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    commands, pending = [], ""
    for line in lines:
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        if pending.strip():
            commands.append(pending.strip())
        pending = ""
    return commands


def main(source, out):
    os.makedirs(out, exist_ok=True)
    files = [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs", "*.md")))
    count, synopses = 0, []
    for path in files:
        relative = os.path.relpath(path, source)
        for start, language, lines in blocks(path):
            if language == "python":
                count += 1
                with open(os.path.join(out, f"{count:03d}.py"), "w") as f:
                    f.write(f"# {relative}:{start}\n" + "\n".join(lines) + "\n")
            elif language in SHELL or language == "":
                commands = shell_commands(language, lines)
                if commands:
                    count += 1
                    with open(os.path.join(out, f"{count:03d}.sh"), "w") as f:
                        f.write(f"# {relative}:{start}\n" + "\n".join(commands) + "\n")
        for number, line in enumerate(open(path, encoding="utf-8"), 1):
            for match in SYNOPSIS.finditer(line):
                synopses.append(f"{relative}:{number} {match.group(1)}")
    with open(os.path.join(out, "synopses"), "w") as f:
        f.write("\n".join(synopses) + "\n")
    print(f"{count} code blocks, {len(synopses)} inline synopses from {len(files)} files")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
