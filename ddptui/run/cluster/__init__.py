"""Multi-node runs: node 0 hosts the dashboard, the telemetry collector and the join service;
``ddptui join`` agents start the other nodes' ranks under torchrun (c10d rendezvous), by hand
or through Slurm's ``srun``. ddptui adds configuration, authenticated telemetry and teardown;
torchrun's elastic agent does the launching and the rendezvous.

Node 0's side, used by the session and the option checks: :mod:`.addresses` (endpoints, the
address other nodes reach), :mod:`.token` (keys and the join token), :mod:`.host` (node 0's
join service and CURVE inbox), :mod:`.slurm` (allocation layout, srun, sbatch). The other
nodes' side, the ``ddptui join`` command and its agent, is the front end :mod:`ddptui.join`.
"""
