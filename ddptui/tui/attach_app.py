"""``ddptui attach`` as an app: the dashboard opened on one followed run (the
:class:`~ddptui.tui.screens.attach.AttachScreen`); quitting leaves the run running."""

from __future__ import annotations

from pathlib import Path

from ddptui.tui.app import DdpTuiApp, Deps
from ddptui.tui.follow import FollowSource
from ddptui.tui.screens.attach import AttachScreen
from ddptui.tui.sources import RunSource


class AttachApp(DdpTuiApp):
    """The dashboard opened on one followed run; quitting leaves the run running."""

    TITLE = "ddptui attach"

    def __init__(self, source: FollowSource, *, deps: Deps | None = None, **kwargs) -> None:
        super().__init__("replay", deps=deps, replay_source=source, **kwargs)

    def show_run(self, source: RunSource) -> None:
        assert isinstance(source, FollowSource)
        self._enter(
            "attach",
            AttachScreen(source, self.deps.refresh_hz, self.deps.chart_hz, self.deps.panel_hz),
        )


def run_attach(run_dir: Path) -> int:
    """Open the dashboard on ``run_dir`` until quit. Raises RunDirError for a bad directory."""
    source = FollowSource(run_dir)
    app = AttachApp(source)
    try:
        app.run()
    finally:
        source.close()
    return 0
