"""The summary of a ``scripts/suite-cpu.sh`` log: CPU by area, module and test."""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(argv: list[str]) -> None:
    with open(argv[0]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    tests = [r for r in rows if "test" in r]
    workers = [r for r in rows if "worker_total" in r]
    in_tests = sum(r["cpu"] for r in tests)
    print(f"tests: {len(tests)}, {in_tests:.1f} s of CPU in tests", end="")
    if workers:
        print(
            f", {sum(r['worker_total'] for r in workers) - in_tests:.1f} s in {len(workers)}"
            " workers outside them (collection)",
            end="",
        )
    print()
    if len(argv) >= 4:
        cpu, wall, cores = float(argv[1]), float(argv[2]), int(argv[3])
        print(f"cores kept busy: {cpu / (wall * cores):.0%} of {cores} over {wall:.0f} s")
    by_area: dict[str, float] = defaultdict(float)
    by_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in tests:
        module = r["test"].split("::")[0]
        by_area["/".join(module.split("/")[:2])] += r["cpu"]
        entry = by_module[module]
        entry[0] += r["cpu"]
        entry[1] += r["wall"]
        entry[2] += 1
    print("\n| area | CPU s |\n|---|---:|")
    for area, cpu_s in sorted(by_area.items(), key=lambda x: -x[1]):
        print(f"| {area} | {cpu_s:.1f} |")
    print("\n| module | CPU s | wall s | tests |\n|---|---:|---:|---:|")
    for module, (cpu_s, wall_s, count) in sorted(by_module.items(), key=lambda x: -x[1][0])[:25]:
        print(f"| {module} | {cpu_s:.1f} | {wall_s:.1f} | {count} |")
    print("\n| test | CPU s | wall s |\n|---|---:|---:|")
    for r in sorted(tests, key=lambda r: -r["cpu"])[:15]:
        print(f"| {r['test'][:110]} | {r['cpu']:.1f} | {r['wall']:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
