"""The Textual dashboard: launch form, live run view, replay, GPU/system monitor.

Imported only by ``ddptui.cli`` for the dashboard modes (the headless path never imports
Textual). Screens draw from :class:`~ddptui.run.state.RunState` and monitor snapshots; they never
talk to sockets, NVML or psutil themselves.
"""
