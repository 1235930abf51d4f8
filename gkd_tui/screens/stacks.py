"""The stack viewer: the stacks grouped (identical ones together, the odd ones out first), then a tab
per worker, searchable, from the newest dump (saved under RUN/stacks)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Input, Static, TabbedContent, TabPane, TextArea
from textual.widgets.text_area import Selection

from gkd_core.stack_text import grouped_report, user_threads_first
from gkd_core.state import StackRecord


class StackScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q", "app.pop_screen", "Close"), Binding("slash", "search", "Search")]
    AUTO_FOCUS = "TextArea"  # the stack, not the search box: q closes, the arrows scroll

    def __init__(self, stacks: dict[str, StackRecord], dump_id: str, lead: frozenset[str] = frozenset()):
        super().__init__()
        self.stacks = stacks
        self.dump_id = dump_id
        self.lead = lead  # the workers the active alerts name: their group first

    def compose(self) -> ComposeResult:
        yield Static(f"stacks of dump {self.dump_id} — / search, tab/←→ switch, escape close", id="stack-title")
        yield Input(placeholder="search the stack (enter: next match)", id="stack-search")
        with TabbedContent(id="stack-tabs"):
            if len(self.stacks) > 1:
                with TabPane(f"grouped ({len(self.stacks)})", id="stack-grouped"):
                    yield TextArea(grouped_text(self.stacks, self.lead), read_only=True, soft_wrap=False)
            for i, (target, rec) in enumerate(sorted(self.stacks.items())):
                text = user_threads_first(rec.text) if rec.text else f"(no stack: {rec.error})"
                if rec.text and rec.error:  # a note beside a stack: a stopped process, a fallback taken
                    text = f"# note: {rec.error}\n{text}"
                with TabPane(f"{target} ({rec.method or 'none'})", id=f"stack-{i}"):
                    yield TextArea(text, read_only=True, show_line_numbers=True, soft_wrap=False)

    def action_search(self) -> None:
        self.query_one("#stack-search", Input).focus()

    def on_input_submitted(self, message: Input.Submitted) -> None:
        query = message.value.strip().lstrip("/")
        tabs = self.query_one(TabbedContent)
        pane = tabs.get_pane(tabs.active) if tabs.active else None
        if not query or pane is None:
            return
        area = pane.query_one(TextArea)
        lines = area.text.splitlines()
        start = area.cursor_location[0] + 1
        for offset in range(len(lines)):
            row = (start + offset) % max(1, len(lines))
            if query.lower() in lines[row].lower():
                col = lines[row].lower().index(query.lower())
                area.selection = Selection((row, col), (row, col + len(query)))
                area.scroll_cursor_visible()
                return
        self.notify(f"'{query}' not in this stack", severity="warning", timeout=2)


def grouped_text(stacks: dict[str, StackRecord], lead: frozenset[str] | set[str] = frozenset()) -> str:
    """What `gkd-tui dump-stacks` prints: the summary, then a group per distinct stack, the workers an
    alert names first, then the odd ones out; and why a stack could not be read."""
    return grouped_report({t: r.text for t, r in stacks.items() if r.text}, lead,
                          {t: r.error for t, r in stacks.items() if r.error})
