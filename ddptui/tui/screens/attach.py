"""``ddptui attach``: the run screen on a run another ddptui process owns.

The same header, rank table, charts, system panel and logs as a launched run; the controls
that need the owning process (stop, restart, back to the form) say so instead of acting.
When the run ends the header says how, and a notification says it once.
"""

from __future__ import annotations

from ddptui.formatting import printable
from ddptui.tui.follow import FollowSource
from ddptui.tui.screens.run import RunScreen

OWNER_ONLY = (
    "this run belongs to another ddptui process: {what} it there (Ctrl-C in its terminal stops it)"
)


class AttachScreen(RunScreen):
    """RunScreen over a :class:`FollowSource`."""

    def __init__(self, source: FollowSource, *args, **kwargs) -> None:
        super().__init__(source, *args, **kwargs)
        self.follow = source
        self._ended_seen = False

    def on_mount(self) -> None:
        super().on_mount()
        self.follow.start()
        self.set_interval(0.25, self._check_end, name="attach-end")

    def on_unmount(self) -> None:
        self.follow.close()

    def _check_end(self) -> None:
        if self._ended_seen or self.follow.ended is None:
            return
        self._ended_seen = True
        self.refresh_view()
        self.refresh_charts()
        self.refresh_charts()
        self.refresh_bindings()
        self.notify(printable(self.follow.ended), title="the run has ended", markup=False)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("stop_run", "restart", "back"):
            return True  # shown, so that pressing them explains why they do nothing here
        return super().check_action(action, parameters)

    def action_stop_run(self) -> None:
        self.notify(OWNER_ONLY.format(what="stop"), severity="warning")

    def action_restart(self) -> None:
        self.notify(OWNER_ONLY.format(what="restart"), severity="warning")

    def action_back(self) -> None:
        self.notify("attached to a run: there is no launch form here (q quits; the run goes on)")
