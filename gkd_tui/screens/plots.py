"""`p`: the run's numbers as plots, a tab each (``figures.TABS``): training (loss, KL and agreement
against step), sync (each sync's time against its timeout), step time (a step's phases, stacked),
teacher (latency p50/p99, queue and in flight), GPU (use and memory per device, and their mean), memory
(the largest processes' phase peaks against their limits).

The plots are textual-plot's ``PlotWidget`` (native Textual widgets, lines of block quadrants),
chosen over textual-plotext for speed: bench/bench_plots.py draws the same figures with both. A plot
costs tens of milliseconds to draw, so the view redraws once a second, only the tab on screen, and
only a plot whose figure changed. Beneath it only a replay's clock goes on (``GkdApp._redraw``): the
main screen's panes are drawn again when it closes.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.color import Color
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Static, TabbedContent, TabPane
from textual_plot import HiResMode, LegendLocation, PlotWidget

from gkd_core.state import RunState
from gkd_tui.figures import TABS, Figure, figures
from gkd_tui.sources import Source

REDRAW_S = 1.0


class PlotsScreen(Screen[None]):
    BINDINGS = [
        Binding("escape,q,p", "app.pop_screen", "Close"),
        *(Binding(str(i + 1), f"show({i})", tab) for i, tab in enumerate(TABS)),
    ]

    def __init__(self, source: Source, tab: int = 0):
        super().__init__()
        self.source = source  # the dashboard's: a live run, a replay or Ray's state API
        self.first_tab = tab
        self._drawn: dict[str, Figure] = {}  # a plot's id -> the figure it shows

    def compose(self) -> ComposeResult:
        yield Static(f"plots: 1-{len(TABS)} or tab/←→ switch, escape close", id="plots-title")
        empty = RunState()
        with TabbedContent(id="plot-tabs", initial=f"plots-{self.first_tab}"):
            for i, tab in enumerate(TABS):
                with TabPane(f"{i + 1} {tab}", id=f"plots-{i}"):
                    for j, _ in enumerate(figures(tab, empty)):
                        with Vertical(classes="plot-box"):  # the border, titled with what the plot says
                            # no zoom: the once-a-second redraw would undo it
                            yield PlotWidget(id=f"plot-{i}-{j}", allow_pan_and_zoom=False)
        yield Footer()

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(REDRAW_S, self.redraw)

    def on_tabbed_content_tab_activated(self) -> None:
        self.redraw()  # at once, not at the next second

    def action_show(self, index: int) -> None:
        self.query_one(TabbedContent).active = f"plots-{index}"

    def redraw(self) -> None:
        active = self.query_one(TabbedContent).active
        if not active:
            return
        i = int(active.rsplit("-", 1)[1])
        with self.source.lock:
            figs = figures(TABS[i], self.source.state)
        for j, fig in enumerate(figs):
            plot_id = f"plot-{i}-{j}"
            if self._drawn.get(plot_id) != fig:
                self._drawn[plot_id] = fig
                draw(self.query_one(f"#{plot_id}", PlotWidget), fig, self.colour)

    def colour(self, variable: str) -> str:
        """A theme variable as a Rich style: an ANSI colour by its number, so the terminal's own
        palette draws it, as it draws the rest of the dashboard."""
        c = Color.parse(self.app.theme_variables.get(variable, "white"))
        return f"color({c.ansi})" if c.ansi is not None and c.ansi >= 0 else c.hex


def draw(plot: PlotWidget, fig: Figure, colour) -> None:
    plot.clear()
    drawn = [line for line in fig.lines if line.x]
    for line in drawn:
        style = colour(line.colour)
        if line.kind == "points":
            plot.scatter(line.x, line.y, marker_style=style, hires_mode=HiResMode.QUADRANT, label=line.label)
        else:
            plot.plot(line.x, line.y, line_style=style, hires_mode=HiResMode.QUADRANT, label=line.label)
    # the axes' labels take rows of their own: only where there is one (a step axis says so in the title)
    plot.margin_top = 1 if fig.ylabel else 0
    plot.margin_bottom = 3 if fig.xlabel else 2
    plot.set_xlabel(fig.xlabel)
    plot.set_ylabel(fig.ylabel)
    xlim, ylim = fig.limits()
    plot.set_xlimits(*xlim)
    plot.set_ylimits(*ylim)
    box = plot.parent if isinstance(plot.parent, Vertical) else plot
    box.border_title = fig.title if drawn else f"{fig.title}: {fig.empty}"
    plot.show_legend(LegendLocation.TOPLEFT, is_visible=len(drawn) > 1)
    # textual-plot sizes its canvases on a layout refresh only; a plot first laid out in a hidden tab
    # (or before the screen settled) would draw at that size
    plot.refresh(layout=True)
