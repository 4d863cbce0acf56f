#!/usr/bin/env python3
"""Draw the figures of docs/concepts.md: ranks and process groups, each collective (what
every rank holds before and after), a ring all-reduce against a parameter server, and what
each strategy communicates in forward, backward and the optimizer step; and two figures of
other pages (OTHER_PAGES): the 3-D mesh of docs/layout.md and the LUMI-G node map of
docs/gpus-per-process.md (drawn from sites/lumi-g.toml, the binding ddl applies).

    python scripts/draw_concepts.py            # (re)write docs/img/concepts/*.svg
    python scripts/draw_concepts.py --check    # exit 1 listing stale or missing figures

Plain Python writing SVG text, no matplotlib: the output is byte-for-byte the same on every
machine, so tests/unit/test_concepts_figures.py can compare the committed files with it.
Generic font families only (sans-serif, monospace): no external fonts or scripts.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
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
LUMI_PROFILE = REPO / "sites" / "lumi-g.toml"
#: Figures shown on a page other than docs/concepts.md: file name -> page (under docs/).
OTHER_PAGES = {"layout-3d.svg": "layout.md", "lumi-g-node.svg": "gpus-per-process.md"}

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

    def path(self, d: str, stroke="#444", width=2, dashed=False) -> None:
        dash = ' stroke-dasharray="4 3"' if dashed else ""
        self.parts.append(f'<path d="{d}" fill="none" stroke="{stroke}" '
                          f'stroke-width="{width}"{dash}/>')

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


# --- a parameter server against a ring all-reduce ----------------------------------------
def ring_figure() -> str:
    """4 workers summing gradients of size S: through one server, or around a ring."""
    svg = Svg(330)
    svg.title("Summing gradients: a parameter server or a ring all-reduce",
              "4 ranks, gradients of S bytes each; NCCL/RCCL and gloo use rings (and trees)")
    red, grey = COMM["all-reduce"], "#888"
    # left: a parameter server
    svg.text(14, 72, "parameter server", size=13, weight="bold")
    svg.rect(110, 84, 110, 34, fill=SUM_FILL)
    svg.text(165, 106, "server", anchor="middle", weight="bold")
    for i in range(4):
        x = 24 + i * 78
        svg.rect(x, 200, 64, 34, fill=RANK_FILL[i])
        svg.text(x + 32, 222, f"rank {i}", anchor="middle", size=12, weight="bold")
        svg.arrow(x + 22, 198, x + 22, 122, grey, 2)  # gradients up
        svg.arrow(x + 42, 120, x + 42, 196, red, 2)  # the sum back down
    svg.line(42, 120, 298, 120, grey, 1)
    for i, line in enumerate(["grey up: each rank's S; red down: the sum S",
                              "the server's link carries 4 S in and 4 S out:",
                              "it grows with the ranks (the bottleneck)"]):
        svg.text(14, 258 + i * 18, line, size=12, fill="#444")
    # right: a ring
    svg.text(370, 72, "ring all-reduce", size=13, weight="bold")
    spots = [(400, 90), (560, 90), (560, 190), (400, 190)]  # rank 0..3, clockwise
    for i, (x, y) in enumerate(spots):
        svg.rect(x, y, 80, 34, fill=RANK_FILL[i])
        svg.text(x + 40, y + 22, f"rank {i}", anchor="middle", size=12, weight="bold")
    svg.arrow(482, 107, 556, 107, red, 3)
    svg.arrow(600, 126, 600, 186, red, 3)
    svg.arrow(558, 207, 484, 207, red, 3)
    svg.arrow(440, 188, 440, 128, red, 3)
    svg.text(520, 152, "S/4 per hop", size=12, anchor="middle", fill=red)
    for i, line in enumerate(["each rank sends chunks of S/4 to its neighbour:",
                              "3 steps add up the chunks (reduce-scatter),",
                              "3 more pass the sums on (all-gather):",
                              "2 x 3/4 S per rank, whatever the number of ranks"]):
        svg.text(370, 240 + i * 18, line, size=12, fill="#444")
    return svg.render()


# --- the 3-D mesh of docs/layout.md on two nodes ------------------------------------------
def layout_3d_figure() -> str:
    """--mesh pp=2,tp=2,dp_shard=2 on 2 nodes of 4: who talks to whom, and where."""
    degrees = {"pp": 2, "dp_shard": 2, "tp": 2}
    layout = ParallelLayout(**degrees)
    svg = Svg(410)
    svg.title("8 ranks, pp=2 x dp_shard=2 x tp=2, on 2 nodes of 4",
              "ddl layout --mesh pp=2,tp=2,dp_shard=2 --nproc 4 --nodes 2")
    box_w, gap = 110, 26
    xs = [40 + i * (box_w + gap) + (i // 2) * 20 for i in range(4)]
    tops = {0: 104, 1: 262}
    for node in (0, 1):
        top = tops[node]
        svg.rect(14, top - 36, 672, 92, fill="#f6f6f6", stroke="#888", rx=8)
        svg.text(24, top - 18, f"node {node}: pipeline stage {node}", weight="bold", fill="#555")
        for local in range(4):
            rank = node * 4 + local
            where = layout.coordinates(rank)
            if local % 2 == 0:
                svg.rect(xs[local] - 6, top - 6, 2 * box_w + gap + 12, 46, stroke=COMM["all-reduce"],
                         dashed=True, rx=6)
            svg.rect(xs[local], top, box_w, 34, fill=RANK_FILL[rank % 4])
            svg.text(xs[local] + box_w // 2, top + 15, f"rank {rank}", anchor="middle",
                     weight="bold", size=12)
            svg.text(xs[local] + box_w // 2, top + 29,
                     f"shard {where['dp_shard']}, tp {where['tp']}", anchor="middle", size=11)
    # dp_shard pairs: a bracket above node 0's ranks and below node 1's
    for group in layout.groups("dp_shard"):
        a, b = (r % 4 for r in group)
        lane = a  # 0 or 1: two brackets side by side
        x1, x2 = xs[a] + 40 + lane * 30, xs[b] + 40 + lane * 30
        if group[0] < 4:
            y0, y1 = tops[0] - 6, tops[0] - 14 - lane * 6
        else:
            y0, y1 = tops[1] + 40, tops[1] + 48 + lane * 6
        svg.path(f"M{x1},{y0} L{x1},{y1} L{x2},{y1} L{x2},{y0}", COMM["all-gather"], 2)
    # pp pairs: straight down from stage 0 to stage 1
    for first, second in layout.groups("pp"):
        x = xs[first] + box_w // 2
        svg.arrow(x, tops[0] + 42, x, tops[1] - 8, COMM["send/recv"], 3)
    for i, (line, colour) in enumerate([
            ("pp pairs (arrows): activations down, gradients back: the only traffic between "
             "nodes", COMM["send/recv"]),
            ("tp pairs (dashed): all-reduces inside every layer, on one node's fast links",
             COMM["all-reduce"]),
            ("dp_shard pairs (brackets): FSDP's all-gathers and reduce-scatters, inside a node",
             COMM["all-gather"])]):
        svg.text(14, 348 + i * 18, line, size=12, fill=colour)
    return svg.render()


# --- LUMI-G: which cores sit next to which GCD ---------------------------------------------
def lumi_node_figure(profile: Path = LUMI_PROFILE) -> str:
    """The LUMI-G node: 8 CCDs of 8 cores in 4 NUMA nodes, each CCD linked to one GCD of the
    4 MI250X; the cores ddl binds each local rank to, read from the site profile."""
    binding = tomllib.loads(profile.read_text())["cpu_binding"]
    cores = binding["worker_cores"]
    masks = binding["srun"].split(":", 1)[1].split(",")
    ccd_gcd = {min(c) // 8: g for g, c in enumerate(cores)}
    svg = Svg(420)
    svg.title("LUMI-G node: 64 cores in 4 NUMA nodes, 4 MI250X = 8 GCDs",
              f"sites/lumi-g.toml [cpu_binding]: local rank g -> GCD g -> its 7 cores")
    col = 84
    for numa in range(4):
        x0 = 14 + numa * 2 * col
        svg.rect(x0, 56, 2 * col - 4, 96, fill="#f6f6f6", stroke="#888", rx=6)
        svg.text(x0 + 6, 72, f"NUMA {numa}", size=12, weight="bold", fill="#555")
    for ccd in range(8):
        x = 20 + ccd * col
        gcd = ccd_gcd.get(ccd)
        svg.rect(x, 80, col - 16, 62, fill=RANK_FILL[gcd] if gcd is not None else "#eee")
        svg.text(x + 4, 96, f"CCD {ccd}", size=12, weight="bold")
        svg.text(x + 4, 112, f"cores {8 * ccd}-{8 * ccd + 7}", size=11)
        svg.text(x + 4, 126, f"{8 * ccd}: the OS's", size=10, fill="#666")
        if gcd is not None:
            svg.text(x + 4, 138, f"{min(cores[gcd])}-{max(cores[gcd])}: rank {gcd}", size=10)
            svg.line(x + (col - 16) // 2, 144, x + (col - 16) // 2, 196, "#444", 2)
    for module in range(4):
        gcds = [ccd for ccd in range(8) if ccd_gcd.get(ccd) in (2 * module, 2 * module + 1)]
        x0 = 14 + min(gcds) * col
        svg.rect(x0, 190, (max(gcds) - min(gcds) + 1) * col - 4, 58, stroke="#888", dashed=True,
                 rx=6)
        svg.text(x0 + 6, 244, f"MI250X {module}", size=11, fill="#555")
    for ccd, gcd in sorted(ccd_gcd.items()):
        x = 20 + ccd * col
        svg.rect(x, 198, col - 16, 30, fill=RANK_FILL[gcd])
        svg.text(x + (col - 16) // 2, 218, f"GCD {gcd}", anchor="middle", weight="bold", size=12)
    svg.text(14, 272, "srun --cpu-bind=mask_cpu:... (one task per GCD), in local-rank order:",
             size=12, fill="#444")
    for g, mask in enumerate(masks):
        x, y = 14 + (g // 4) * 344, 292 + (g % 4) * 18
        svg.text(x, y, f"rank {g}: GCD {g}, cores {min(cores[g])}-{max(cores[g])}, {mask}",
                 size=11, mono=True)
    for i, line in enumerate([
            "GCD numbers do not follow NUMA numbers: GCD 0 sits by cores 49-55 (NUMA 3).",
            "Pinning rank g there keeps its host memory and its GCD link local."]):
        svg.text(14, 378 + i * 18, line, size=12, fill="#444")
    return svg.render()


def figures() -> dict[str, str]:
    """Every figure: file name -> SVG text."""
    return {"ranks.svg": ranks_figure(), **collectives(), "ring-allreduce.svg": ring_figure(),
            **strategies(), "layout-3d.svg": layout_3d_figure(),
            "lumi-g-node.svg": lumi_node_figure()}


def stale(out: Path) -> list[str]:
    """Figures in ``out`` that are missing, differ from what this script draws, or are no
    longer drawn by it."""
    drawn = figures()
    wrong = [name for name, text in drawn.items()
             if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text]
    extra = [p.name for p in sorted(out.glob("*.svg")) if p.name not in drawn]
    return sorted(wrong + extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
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
