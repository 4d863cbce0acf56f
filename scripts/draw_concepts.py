#!/usr/bin/env python3
"""Draw the figures of docs/concepts.md: ranks and process groups, each collective (what
every rank holds before and after), and what each strategy communicates in forward,
backward and the optimizer step.

    python scripts/draw_concepts.py            # (re)write docs/img/concepts/*.svg
    python scripts/draw_concepts.py --check    # exit 1 listing stale or missing figures

Plain Python writing SVG text, no matplotlib: the output is byte-for-byte the same on every
machine, so tests/unit/test_concepts_figures.py can compare the committed files with it.
Generic font families only (sans-serif, monospace): no external fonts or scripts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from xml.sax.saxutils import escape

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "docs" / "img" / "concepts"
try:  # the groups come from ddl's layout; its contract layer needs no torch
    from ddl.contract.layout import ParallelLayout
except ImportError:  # run outside the venv: the source tree
    sys.path.insert(0, str(REPO / "packages" / "core" / "src"))
    from ddl.contract.layout import ParallelLayout
WIDTH = 700  # the docs' content column

# Rank colours (light fills, text stays readable on them), one per rank.
RANK_FILL = ["#8ecae6", "#ffc857", "#a7d98b", "#f4a6a6",
             "#cdb4db", "#ffd6a5", "#a0c4ff", "#d8d8a0"]
LETTERS = "ABCDEFGH"
SUM_FILL = "#e0e0e0"
# One colour per kind of communication, the same in every figure.
COMM = {"all-reduce": "#b91c1c", "all-gather": "#1d4ed8", "reduce-scatter": "#7e22ce",
        "send/recv": "#15803d", "broadcast": "#0f766e"}


class Svg:
    """A list of SVG elements with integer coordinates (so the text never varies)."""

    def __init__(self, height: int) -> None:
        self.height = height
        self.parts: list[str] = []

    def rect(self, x, y, w, h, fill="none", stroke="#444", dashed=False, rx=4) -> None:
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        self.parts.append(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="{rx}" '
                          f'fill="{fill}" stroke="{stroke}"{dash}/>')

    def text(self, x, y, s, size=13, anchor="start", weight="normal", fill="#222",
             mono=False) -> None:
        family = "monospace" if mono else "sans-serif"
        self.parts.append(f'<text x="{x}" y="{y}" font-family="{family}" font-size="{size}" '
                          f'text-anchor="{anchor}" font-weight="{weight}" fill="{fill}">'
                          f'{escape(s)}</text>')

    def line(self, x1, y1, x2, y2, stroke="#444", width=2) -> None:
        self.parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" '
                          f'stroke="{stroke}" stroke-width="{width}"/>')

    def dot(self, x, y, fill, r=5) -> None:
        self.parts.append(f'<circle cx="{x}" cy="{y}" r="{r}" fill="{fill}"/>')

    def arrow(self, x1, y1, x2, y2, stroke="#444", width=2) -> None:
        """A horizontal or vertical arrow with its head at (x2, y2)."""
        dx, dy = (x2 > x1) - (x2 < x1), (y2 > y1) - (y2 < y1)
        self.line(x1, y1, x2 - 7 * dx, y2 - 7 * dy, stroke, width)
        back_x, back_y = x2 - 9 * dx, y2 - 9 * dy
        side_x, side_y = 5 * dy, 5 * dx
        points = (f"{x2},{y2} {back_x + side_x},{back_y + side_y} "
                  f"{back_x - side_x},{back_y - side_y}")
        self.parts.append(f'<polygon points="{points}" fill="{stroke}"/>')

    def title(self, heading: str, subtitle: str) -> None:
        self.text(10, 22, heading, size=15, weight="bold")
        self.text(10, 42, subtitle, size=12, fill="#555", mono=True)

    def render(self) -> str:
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
                f'height="{self.height}" viewBox="0 0 {WIDTH} {self.height}">')
        background = f'<rect width="{WIDTH}" height="{self.height}" fill="#ffffff"/>'
        return "\n".join([head, background, *self.parts, "</svg>"]) + "\n"


# --- collectives: what each of 4 ranks holds, before and after -------------------------
# A cell is (label, fill), or None: a slot whose contents do not matter or that the rank
# does not hold (a dashed outline).
RANKS = 4
CELL_W, CELL_H, ROW_H, TOP = 52, 26, 36, 78


def own(rank: int, chunks=range(RANKS)) -> list:
    """Rank ``rank``'s own data, chunk by chunk (A0..A3 on rank 0, B0..B3 on rank 1...)."""
    return [(f"{LETTERS[rank]}{i}", RANK_FILL[rank]) if i in chunks else None
            for i in range(RANKS)]


def summed(chunks=range(RANKS)) -> list:
    return [(f"\u03a3{i}", SUM_FILL) if i in chunks else None for i in range(RANKS)]


def _cells(svg: Svg, x: int, y: int, cells: list) -> None:
    for i, cell in enumerate(cells):
        cx = x + i * (CELL_W + 3)
        if cell is None:
            svg.rect(cx, y, CELL_W, CELL_H, stroke="#aaa", dashed=True)
        else:
            svg.rect(cx, y, CELL_W, CELL_H, fill=cell[1])
            svg.text(cx + CELL_W // 2, y + 18, cell[0], anchor="middle")


def collective(heading: str, call: str, kind: str, before: list, after: list,
               legend: str, idle: tuple[int, ...] = ()) -> str:
    svg = Svg(TOP + RANKS * ROW_H + 34)
    svg.title(heading, call)
    left, right = 80, 430
    svg.text(left, 66, "before", size=12, weight="bold", fill="#555")
    svg.text(right, 66, "after", size=12, weight="bold", fill="#555")
    for r in range(RANKS):
        y = TOP + r * ROW_H
        svg.text(10, y + 18, f"rank {r}", weight="bold")
        if r in idle:
            for x in (left, right):
                svg.text(x + 4, y + 18, "(not taking part)", size=12, fill="#888")
            continue
        _cells(svg, left, y, before[r])
        _cells(svg, right, y, after[r])
    mid = TOP + RANKS * ROW_H // 2
    svg.arrow(left + 4 * (CELL_W + 3) + 8, mid, right - 12, mid, COMM[kind], 3)
    svg.text((left + 4 * (CELL_W + 3) + right) // 2, mid - 10, kind, size=12,
             anchor="middle", weight="bold", fill=COMM[kind])
    svg.text(10, TOP + RANKS * ROW_H + 18, legend, size=12, fill="#444")
    return svg.render()


def collectives() -> dict[str, str]:
    everyone = [own(r) for r in range(RANKS)]
    nothing = [None] * RANKS
    return {
        "broadcast.svg": collective(
            "broadcast: one rank's tensor copied to all", "dist.broadcast(t, src=0)",
            "broadcast", [own(0)] + [nothing] * 3, [own(0)] * RANKS,
            "Every rank passes a tensor of the same shape; after the call all hold rank 0's."),
        "all-reduce.svg": collective(
            "all-reduce: every rank ends with the sum", "dist.all_reduce(t)   (op=SUM)",
            "all-reduce", everyone, [summed()] * RANKS,
            "\u03a3i = Ai + Bi + Ci + Di, the same on every rank (or max, min, ...; "
            "DDP divides by 4)."),
        "reduce-scatter.svg": collective(
            "reduce-scatter: sum, then each rank keeps one chunk",
            "dist.reduce_scatter_tensor(out, t)", "reduce-scatter", everyone,
            [summed([r]) for r in range(RANKS)],
            "Rank i keeps only \u03a3i: the sum of everyone's chunk i, a quarter of the data."),
        "all-gather.svg": collective(
            "all-gather: every rank ends with all chunks",
            "dist.all_gather_into_tensor(out, t)", "all-gather",
            [own(r, [r]) for r in range(RANKS)],
            [[(f"{LETTERS[i]}{i}", RANK_FILL[i]) for i in range(RANKS)]] * RANKS,
            "Each rank contributes its chunk; all ranks hold the concatenation. "
            "reduce-scatter + all-gather = all-reduce."),
        "send-recv.svg": collective(
            "send / recv: point to point, two ranks", "dist.send(t, dst=1) | dist.recv(t, src=0)",
            "send/recv", [own(0), nothing, nothing, nothing], [own(0), own(0), nothing, nothing],
            "Only the two ranks named take part; the others run on (a pipeline's stage hand-off).",
            idle=(2, 3)),
    }


# --- ranks, nodes and process groups -----------------------------------------------------
def ranks_figure() -> str:
    """8 ranks on 2 nodes of 4, mesh dp_shard=4,tp=2: rank = shard x 2 + tp."""
    svg = Svg(290)
    svg.title("8 processes on 2 nodes: WORLD_SIZE=8, rank, local rank, groups",
              "ddl layout --mesh dp_shard=4,tp=2 --nodes 2")
    box_w, box_h = 68, 54
    for node in range(2):
        x0 = 12 + node * 350
        svg.rect(x0, 58, 334, 120, fill="#f6f6f6", stroke="#888", rx=8)
        svg.text(x0 + 10, 76, f"node {node}", weight="bold", fill="#555")
        for local in range(4):
            rank = node * 4 + local
            x = x0 + 12 + local * (box_w + 8) + local // 2 * 10
            if local % 2 == 0:  # one tensor-parallel pair: a dashed box around it
                svg.rect(x - 4, 86, 2 * box_w + 18, box_h + 14, stroke=COMM["all-reduce"],
                         dashed=True, rx=6)
            svg.rect(x + 2, 93, box_w, box_h, fill=RANK_FILL[rank % 2])
            svg.text(x + 2 + box_w // 2, 114, f"rank {rank}", anchor="middle", weight="bold")
            svg.text(x + 2 + box_w // 2, 134, f"local {local}", size=12, anchor="middle")
    def listed(dim: str) -> str:
        return " ".join("[" + ",".join(map(str, g)) + "]" for g in groups(dim, dp_shard=4, tp=2))

    lines = [(f"tp groups (dashed): {listed('tp')}, inside a node", COMM["all-reduce"]),
             (f"dp_shard groups (colour): {listed('dp_shard')}, across both nodes", "#333"),
             ("rank: 0..7, unique in the whole job (WORLD_SIZE=8 processes)", "#333"),
             ("local rank: 0..3, unique on its node; picks the node's GPU", "#333")]
    for i, (line, colour) in enumerate(lines):
        svg.text(14, 204 + i * 20, line, size=13, fill=colour)
    return svg.render()


# --- strategies: who talks to whom, in forward, backward and the optimizer step ----------
# An event: (label, kind, groups); a group is a tuple of ranks joined by one collective,
# or for send/recv a (source, destination) pair drawn as an arrow.
PHASES = (("forward", 232, 150), ("backward", 392, 170), ("optimizer step", 572, 120))
S_TOP, S_ROW = 76, 34


def _lanes(groups: list[tuple[int, ...]]) -> list[int]:
    """A lane (x offset index) per group so that groups in one lane never overlap."""
    ends: list[int] = []
    lanes = []
    for group in groups:
        low, high = min(group), max(group)
        lane = next((i for i, end in enumerate(ends) if end < low), len(ends))
        if lane == len(ends):
            ends.append(high)
        ends[lane] = high
        lanes.append(lane)
    return lanes


def strategy(heading: str, where: str, holds: list[str], phases: dict) -> str:
    n = len(holds)
    legend_lines = max(len(phases.get(name, [])) or 1 for name, _, _ in PHASES)
    rows_end = S_TOP + n * S_ROW
    svg = Svg(rows_end + 18 + legend_lines * 32)
    svg.title(heading, where)
    svg.text(62, 66, "holds", size=12, weight="bold", fill="#555")
    for name, x, w in PHASES:
        svg.rect(x, 52, w, rows_end - 52 + 4, fill="#f7f7f7", stroke="#ddd", rx=6)
        svg.text(x + 8, 66, name, size=12, weight="bold", fill="#555")
    for r, text in enumerate(holds):
        y = S_TOP + r * S_ROW
        svg.text(10, y + 20, f"rank {r}", size=12, weight="bold")
        svg.rect(62, y + 3, 160, S_ROW - 6, fill=RANK_FILL[r])
        svg.text(70, y + 21, text, size=12)
    for name, x, w in PHASES:
        events = phases.get(name, [])
        if not events:
            svg.text(x + 8, rows_end + 24, "none (local)", size=12, fill="#888")
        lane_x = x + 14
        for i, (label, kind, groups) in enumerate(events):
            colour = COMM[kind]
            lanes = _lanes(groups)
            for group, lane in zip(groups, lanes):
                gx = lane_x + lane * 14
                ys = [S_TOP + r * S_ROW + S_ROW // 2 for r in group]
                if kind == "send/recv":
                    svg.arrow(gx, ys[0], gx, ys[1], colour)
                    svg.dot(gx, ys[0], colour, r=3)
                else:
                    svg.line(gx, min(ys), gx, max(ys), colour, 3)
                    for y in ys:
                        svg.dot(gx, y, colour)
            lane_x += (max(lanes) + 1) * 14 + 8
            for j, part in enumerate(label.split("\n")):
                svg.text(x + 8, rows_end + 24 + i * 32 + j * 14, part, size=11, fill=colour,
                         weight="bold" if j == 0 else "normal")
    return svg.render()


def groups(dim: str, **degrees: int) -> list[tuple[int, ...]]:
    """The process groups of ``dim`` in a layout: ddl's own rank order (docs/layout.md)."""
    return [tuple(g) for g in ParallelLayout(**degrees).groups(dim)]


def strategies() -> dict[str, str]:
    all4 = [(0, 1, 2, 3)]
    hsdp = {"dp_replicate": 2, "dp_shard": 2}
    shard_groups, replicas = groups("dp_shard", **hsdp), groups("dp_replicate", **hsdp)
    pp3, shard3, tp3 = (groups(dim, pp=2, dp_shard=2, tp=2) for dim in ("pp", "dp_shard", "tp"))
    gather, scatter = "all-gather params\nbefore each unit", "reduce-scatter grads\nafter each unit"
    return {
        "ddp.svg": strategy(
            "DDP: whole replicas, gradients all-reduced",
            "--strategy ddp \u00b7 ddl_strategies/ddp.py", ["whole model, batch 1/4"] * 4,
            {"backward": [("all-reduce gradients\nbucket by bucket", "all-reduce", all4)]}),
        "fsdp.svg": strategy(
            "FSDP: parameters sharded, gathered per unit",
            "--strategy fsdp \u00b7 ddl_strategies/fsdp.py",
            [f"shard {r}, batch 1/4" for r in range(4)],
            {"forward": [(gather, "all-gather", all4)],
             "backward": [(gather, "all-gather", all4), (scatter, "reduce-scatter", all4)]}),
        "hsdp.svg": strategy(
            "HSDP: shard inside a group, replicate across",
            "--mesh dp_replicate=2,dp_shard=2 \u00b7 ddl_strategies/fsdp.py",
            [f"replica {r // 2}, shard {r % 2}" for r in range(4)],
            {"forward": [("all-gather params\nin shard groups", "all-gather", shard_groups)],
             "backward": [("all-gather params\nin shard groups", "all-gather", shard_groups),
                          ("reduce-scatter grads\nin shard groups", "reduce-scatter",
                           shard_groups),
                          ("all-reduce grad shards\nacross replicas", "all-reduce", replicas)]}),
        "tp.svg": strategy(
            "Tensor parallel: each matrix split, same batch",
            "--strategy tp \u00b7 ddl_strategies/tp.py", ["1/4 of each matrix"] * 4,
            {"forward": [("all-reduce after each\nrow-parallel layer", "all-reduce", all4)],
             "backward": [("all-reduce after each\ncolumn-parallel layer", "all-reduce",
                           all4)]}),
        "pp.svg": strategy(
            "Pipeline parallel: stages hand over microbatches",
            "--strategy pp \u00b7 ddl_strategies/pipeline.py",
            [f"stage {r} of 4, microbatches" for r in range(4)],
            {"forward": [("send activations\nto the next stage", "send/recv",
                          [(0, 1), (1, 2), (2, 3)])],
             "backward": [("send their gradients\nto the stage before", "send/recv",
                           [(3, 2), (2, 1), (1, 0)])]}),
        "3d.svg": strategy(
            "3-D: pipeline x FSDP x tensor parallel on 8 ranks",
            "--mesh pp=2,dp_shard=2,tp=2 \u00b7 ddl_strategies/compose.py",
            [f"stage {r // 4}, shard {r // 2 % 2}, tp {r % 2}" for r in range(8)],
            {"forward": [("all-reduce (tp)", "all-reduce", tp3),
                         ("all-gather (dp_shard)", "all-gather", shard3),
                         ("send activations (pp)", "send/recv", pp3)],
             "backward": [("all-reduce (tp)", "all-reduce", tp3),
                          ("all-gather, reduce-scatter\n(dp_shard)", "reduce-scatter", shard3),
                          ("send gradients (pp)", "send/recv", [g[::-1] for g in pp3])]}),
    }


def figures() -> dict[str, str]:
    """Every figure: file name -> SVG text."""
    return {"ranks.svg": ranks_figure(), **collectives(), **strategies()}


def stale(out: Path) -> list[str]:
    """Figures in ``out`` that are missing, differ from what this script draws, or are no
    longer drawn by it."""
    drawn = figures()
    wrong = [name for name, text in drawn.items()
             if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text]
    extra = [p.name for p in sorted(out.glob("*.svg")) if p.name not in drawn]
    return sorted(wrong + extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 listing stale or missing figures")
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder (default {OUT})")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale(args.out)
        for name in bad:
            print(f"stale, missing or no longer drawn: {args.out / name}")
        if bad:
            print("regenerate with: python scripts/draw_concepts.py")
        return 1 if bad else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in figures().items():
        (args.out / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
