#!/usr/bin/env python3
"""Paired comparison of two builds' figures, round by round.

Reads the log that `dist/ab/run.sh` (scripts/gpu-ab-run.sh) writes: blocks
headed `== old round N` / `== new round N`, each the output of the same
programs. Every number in a line is a figure, named by the line with its
numbers blanked (and, for criterion's indented `time:` / `thrpt:` lines,
by the benchmark named above them) and by its place in the line; but a
size (`4 KiB`, `1024 KiB`, `2MiB`) is part of the name, not a figure, so
that lines that differ only in the size they measure are told apart. For each
figure that both builds printed in a round, the per-round difference (new
minus old) and ratio; printed are the medians over the rounds, the
builds' own medians, and in how many rounds new was the lower; a figure
is shown as its line, `@` where it stands and `#` for the others. Figures
that never change (round counts, sizes) are left out.

The host's own speed drifts between rounds by more than most changes
move a figure (docs/measurements.md): the pairing within a round, with
the builds' order alternating from round to round, is what takes the
drift out. Medians, not means: a round that a neighbour's burst slowed
moves them little.

    scripts/ab-compare.py LOG
    scripts/ab-compare.py --self-test
"""

import re
import statistics
import sys
from collections import defaultdict

NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?")
# A size, kept in a figure's name; else a number, a figure.
SIZE_OR_NUMBER = re.compile(r"(\d+ ?[KMG]iB\b)|" + NUMBER.pattern)
HEADER = re.compile(r"^== (old|new) round (\d+)\s*$")


# A criterion benchmark's id (`lookup_hit/memhook/65536`): its numbers
# name it, and stay in the key.
BENCH_ID = re.compile(r"^[A-Za-z_][\w.-]*(?:/[\w.-]+)+")


def blank(text):
    """`text` with its numbers as `#` (but a leading benchmark id's and
    sizes) and its runs of spaces as one (a figure's width moves its
    padding)."""
    m = BENCH_ID.match(text)
    head, rest = (m.group(0), text[m.end():]) if m else ("", text)
    return " ".join((head + SIZE_OR_NUMBER.sub(lambda n: n.group(1) or "#", rest)).split())


def numbers_in(text):
    """The figures of `text`: its numbers but sizes, in order."""
    return [n.group(0) for n in SIZE_OR_NUMBER.finditer(text) if not n.group(1)]


def figures(lines):
    """{(build, round): {(key, place): value}} from the log's lines."""
    out = defaultdict(dict)
    build = None
    context = ""
    seen = defaultdict(int)
    for line in lines:
        line = line.rstrip("\n")
        m = HEADER.match(line)
        if m:
            build, rnd = m.group(1), int(m.group(2))
            context = ""
            seen.clear()
            continue
        if build is None or not line.strip():
            continue
        if not line[:1].isspace():
            context = blank(line.strip())
        m = BENCH_ID.match(line.strip())
        numbers = numbers_in(line.strip()[m.end():] if m else line)
        if not numbers:
            continue
        key = blank(line.strip())
        if re.match(r"^\s*(time|thrpt):", line):
            key = f"{context} / {key}"
        # The same line again in one round (a program run twice): the
        # second is a figure of its own.
        seen[key] += 1
        if seen[key] > 1:
            key = f"{key} (#{seen[key]})"
        for place, text in enumerate(numbers):
            try:
                value = float(text.replace(",", ""))
            except ValueError:
                continue
            out[(build, rnd)].setdefault((key, place), value)
    return out


def compare(lines):
    """[(figure, median new - old, median new / old or None, old's median,
    new's median, rounds new was lower, rounds)], the figure as its line
    with `@` for it, and the number of rounds."""
    got = figures(lines)
    rounds = sorted({r for (_, r) in got if ("old", r) in got and ("new", r) in got})
    keys = []
    for r in rounds:
        for k in got[("old", r)]:
            if k in got[("new", r)] and k not in keys:
                keys.append(k)
    rows = []
    for key, place in keys:
        pairs = [(got[("old", r)][(key, place)], got[("new", r)][(key, place)]) for r in rounds
                 if (key, place) in got[("old", r)] and (key, place) in got[("new", r)]]
        if len({v for p in pairs for v in p}) <= 1:
            continue
        positive = all(o > 0 and n > 0 for o, n in pairs)
        marks = iter(range(key.count("#")))
        rows.append((
            re.sub("#", lambda _: "@" if next(marks) == place else "#", key),
            statistics.median(n - o for o, n in pairs),
            statistics.median(n / o for o, n in pairs) if positive else None,
            statistics.median(o for o, _ in pairs),
            statistics.median(n for _, n in pairs),
            sum(n < o for o, n in pairs),
            len(pairs),
        ))
    return rows, len(rounds)


def self_test():
    """The pairing, the figures' names and what is left out, on a log
    made up for it (run by .ci/run)."""
    log = []
    # Round r: the host's speed drifts (x r); new is 10 lower on the
    # added cost, the same on the control, and prints a line twice.
    for r, order in ((1, "old new"), (2, "new old"), (3, "old new")):
        for b in order.split():
            added = 100 * r + (0 if b == "old" else -10)
            log += [f"== {b} round {r}",
                    f"cuMemAlloc_v2+cuMemFree_v2 4KiB, median of the 40000 per-round differences: added {added} ns",
                    f"  after 1024 KiB of work: added {added + 50} ns",
                    f"  after 4096 KiB of work: added {added + 90 + (0 if b == 'old' else 7)} ns",
                    f"  control      {50 * r} ns",
                    f"  hooked, no handler     {'+' if added >= 0 else ''}{added // 10} ns",
                    f"  hooked, no handler     {added // 5} ns",
                    "lookup_hit/memhook/16   time:   [5.0 ns 5.1 ns 5.2 ns]",
                    "lookup_hit/memhook/65536",
                    f"                        time:   [{9 + r}.0 ns {10 + r}.0 ns {11 + r}.0 ns]"]
    log += ["== old round 4", "  control      1 ns"]  # a round new never ran: left out
    rows, rounds = compare(log)
    assert rounds == 3, rounds
    got = {name: row for name, *row in rows}
    # Paired within each round: -10 every round, whatever the drift.
    assert got["cuMemAlloc_v#+cuMemFree_v# 4KiB, median of the # per-round differences: added @ ns"][:5] == \
        [-10, statistics.median([190 / 200, 290 / 300, 90 / 100]), 200, 190, 3], got
    # Sizes name their figures: two lines that differ only in theirs.
    assert got["after 1024 KiB of work: added @ ns"][0] == -10, got
    assert got["after 4096 KiB of work: added @ ns"][0] == -3, got
    assert got["control @ ns"][0] == 0 and got["control @ ns"][4] == 0, got
    # The same text twice in a round: two figures, told apart.
    assert got["hooked, no handler @ ns"][0] == -1, got
    assert got["hooked, no handler @ ns (#2)"][0] == -2, got
    # A benchmark id keeps its numbers; criterion's time under a long id
    # is named by it; figures that never change are left out.
    assert "lookup_hit/memhook/65536 / time: [# ns @ ns # ns]" in got, got
    assert not any(name.startswith("lookup_hit/memhook/16") for name in got), got
    assert not any("v@" in name or "@ KiB" in name or "@KiB" in name for name in got), got
    print("ab-compare.py: self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    if len(sys.argv) != 2:
        sys.exit("usage: ab-compare.py LOG | --self-test")
    with open(sys.argv[1], encoding="utf-8", errors="replace") as f:
        rows, rounds = compare(f)
    if not rounds:
        sys.exit("ab-compare.py: no round has both builds' figures")
    print(f"{rounds} rounds; per figure (@ in its line): the medians of new - old and new / old over the rounds,")
    print("the builds' own medians, and the rounds in which new was the lower")
    for name, diff, ratio, old, new, lower, n in rows:
        ratio = f"{ratio:.3f}x" if ratio is not None else "-"
        print(f"  {name}")
        print(f"      new - old {diff:+.4g}, new / old {ratio}; old {old:.4g}, new {new:.4g}; new lower in {lower} of {n}")


if __name__ == "__main__":
    main()
