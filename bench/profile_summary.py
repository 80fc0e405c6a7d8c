"""Summarises a py-spy `--format raw` profile: the share of samples under each function.

    python bench/profile_summary.py profile.raw [--top 40] [--match notifications/]

A function's share is inclusive (its callees count too) and each sample counts once per
function however deep the recursion.
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>.+?)(?::\d+)?\)$")


def summarise(path: Path, *, match: str | None, top: int) -> list[tuple[float, str]]:
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        samples = int(count)
        total += samples
        seen = set()
        for frame in stack.split(";"):
            found = FRAME.match(frame)
            name = f"{found['func']} ({found['file']})" if found else frame
            if name in seen:
                continue
            seen.add(name)
            inclusive[name] += samples
    rows = [
        (100.0 * n / total, name)
        for name, n in inclusive.most_common()
        if match is None or match in name
    ]
    return rows[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--match")
    args = parser.parse_args()
    for share, name in summarise(args.profile, match=args.match, top=args.top):
        print(f"{share:5.1f} %  {name}")


if __name__ == "__main__":
    main()
