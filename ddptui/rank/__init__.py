"""Code that runs inside every training process: the reporter behind ``ddptui.log``, pending
GPU values, the zero-code instrumentation, stacks on demand and the rank entry. Light to
import: no Textual, and no torch until a tensor is logged or torch is imported by the script."""
