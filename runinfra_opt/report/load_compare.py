"""`report --compare` per load level: for the levels both runs measured, each variant's output tokens/s in OLD
and NEW and their ratio (beyond noise when the two 95% intervals do not overlap), and the winner per level in
each run. Levels only one run measured are listed as such. The regression gate does not look at these figures
(it judges the runs' batch-1 decisions); they are shown, not gated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from runinfra_opt.report import load as load_view
from runinfra_opt.report.markdown import md_escape, md_table
from runinfra_opt.results import Interval, RunResults


@dataclass(frozen=True)
class LevelDelta:
    """One variant at one load level measured in both runs."""

    level: str
    variant: str
    old_tokens_per_s: float | None
    new_tokens_per_s: float | None
    ratio: float | None
    """NEW over OLD output tokens/s (None when either is missing or OLD is 0)."""
    beyond_noise: bool | None
    """The two runs' 95% intervals of tokens/s do not overlap (None: an interval is missing)."""
    old_vs_baseline: float | None
    new_vs_baseline: float | None


@dataclass(frozen=True)
class LevelWinners:
    level: str
    old: str | None
    new: str | None

    @property
    def changed(self) -> bool:
        return self.old != self.new


@dataclass(frozen=True)
class LoadComparison:
    levels: list[str]
    """The levels both runs measured, in NEW's order."""
    variants: list[LevelDelta]
    winners: list[LevelWinners]
    only_old: list[str] = field(default_factory=list)
    only_new: list[str] = field(default_factory=list)
    """Levels only that run measured."""
    only_old_variants: list[str] = field(default_factory=list)
    only_new_variants: list[str] = field(default_factory=list)
    """`variant at level` measured only in that run, at a level both measured."""


def _overlap(a: Interval | None, b: Interval | None) -> bool | None:
    if a is None or b is None:
        return None
    return a.low <= b.high and b.low <= a.high


def compare_load(old: RunResults, new: RunResults) -> LoadComparison | None:
    """The per-level comparison, or None unless both runs were measured under load."""
    if old.load is None or new.load is None:
        return None
    old_levels, new_levels = load_view.levels(old), load_view.levels(new)
    both = [level for level in new_levels if level in old_levels]
    old_rows = {(r.level, r.variant): r for r in load_view.load_rows(old)}
    new_rows = {(r.level, r.variant): r for r in load_view.load_rows(new)}
    deltas = []
    only_old_variants: list[str] = []
    only_new_variants: list[str] = []
    old_winners, new_winners = load_view.winners(old), load_view.winners(new)
    for level in both:
        names = [key[1] for key in new_rows if key[0] == level]
        names += [key[1] for key in old_rows if key[0] == level and key[1] not in names]
        for name in names:
            a, b = old_rows.get((level, name)), new_rows.get((level, name))
            if a is None or b is None:
                (only_new_variants if a is None else only_old_variants).append(f"{name} at {level}")
                continue
            old_tps = a.tokens_per_s.value if a.tokens_per_s else None
            new_tps = b.tokens_per_s.value if b.tokens_per_s else None
            overlap = _overlap(a.tokens_per_s, b.tokens_per_s)
            deltas.append(LevelDelta(
                level=level,
                variant=name,
                old_tokens_per_s=old_tps,
                new_tokens_per_s=new_tps,
                ratio=new_tps / old_tps if old_tps and new_tps is not None else None,
                beyond_noise=None if overlap is None else not overlap,
                old_vs_baseline=a.vs_baseline.value if a.vs_baseline else None,
                new_vs_baseline=b.vs_baseline.value if b.vs_baseline else None,
            ))
    return LoadComparison(
        levels=both,
        variants=deltas,
        winners=[LevelWinners(level, old_winners.get(level), new_winners.get(level)) for level in both],
        only_old=[level for level in old_levels if level not in new_levels],
        only_new=[level for level in new_levels if level not in old_levels],
        only_old_variants=only_old_variants,
        only_new_variants=only_new_variants,
    )


def one_sided(old: RunResults, new: RunResults, old_label: str, new_label: str) -> str | None:
    """The warning when only one run was measured under load."""
    if (old.load is None) == (new.load is None):
        return None
    measured = new_label if old.load is None else old_label
    other = old_label if old.load is None else new_label
    return f"only {measured} was measured under load (--load): no per-level comparison with {other}"


# Rendering ------------------------------------------------------------------------------------------------------

TITLE = "Under load, per level (levels both runs measured)"
WINNERS_TITLE = "Winner per load level"
COLUMNS = ("level", "variant", "old tok/s", "new tok/s", "new/old", "beyond noise", "old vs baseline",
           "new vs baseline")
TERMINAL_HEADERS = ("level", "variant", "old\ntok/s", "new\ntok/s", "new/old", "beyond\nnoise", "old vs\nbaseline",
                    "new vs\nbaseline")
NUMERIC = frozenset(COLUMNS[2:])
WINNER_COLUMNS = ("level", "old winner", "new winner", "changed")


def _num(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def delta_cells(load: LoadComparison) -> list[list[str]]:
    noise = {True: "yes", False: "no", None: "n/a"}
    return [
        [d.level, d.variant, _num(d.old_tokens_per_s), _num(d.new_tokens_per_s), _num(d.ratio, ".2f", "x"),
         noise[d.beyond_noise], _num(d.old_vs_baseline, ".2f", "x"), _num(d.new_vs_baseline, ".2f", "x")]
        for d in load.variants
    ]


def winner_cells(load: LoadComparison) -> list[list[str]]:
    return [[w.level, w.old or "-", w.new or "-", "CHANGED" if w.changed else ""] for w in load.winners]


def tail_lines(load: LoadComparison, old_label: str, new_label: str) -> list[str]:
    lines = []
    if load.only_old:
        lines.append(f"Load levels measured only in {old_label}: {', '.join(load.only_old)}")
    if load.only_new:
        lines.append(f"Load levels measured only in {new_label}: {', '.join(load.only_new)}")
    if load.only_old_variants:
        lines.append(f"Measured under load only in {old_label}: {', '.join(load.only_old_variants)}")
    if load.only_new_variants:
        lines.append(f"Measured under load only in {new_label}: {', '.join(load.only_new_variants)}")
    if not load.levels:
        lines.append("The runs measured no load level in common.")
    return lines


def render_table(load: LoadComparison, console: Console, old_label: str, new_label: str) -> None:
    for title, headers, cells in ((TITLE, TERMINAL_HEADERS, delta_cells(load)),
                                  (WINNERS_TITLE, WINNER_COLUMNS, winner_cells(load))):
        if not cells:
            continue
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for i, header in enumerate(headers):
            numeric = headers is TERMINAL_HEADERS and i >= 2
            table.add_column(header, overflow="fold", justify="right" if numeric else "left")
        for row in cells:
            table.add_row(*row, style="bold" if row[-1] == "CHANGED" else None)
        console.print(table)
    for line in tail_lines(load, old_label, new_label):
        console.print(Text(line))


def render_markdown(load: LoadComparison, old_label: str, new_label: str) -> list[str]:
    out = []
    if load.variants:
        out += [f"### {TITLE}", ""] + md_table(COLUMNS, delta_cells(load), NUMERIC)
        out += ["", "_new/old: NEW's output tokens/s over OLD's at the same level; beyond noise: their 95% "
                "intervals do not overlap; vs baseline: each run's paired ratio at that level._", ""]
    if load.winners:
        out += [f"### {WINNERS_TITLE}", ""] + md_table(WINNER_COLUMNS, winner_cells(load), frozenset()) + [""]
    lines = tail_lines(load, old_label, new_label)
    if lines:
        out += [f"- {md_escape(line)}" for line in lines] + [""]
    return out
