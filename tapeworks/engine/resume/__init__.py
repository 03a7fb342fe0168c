"""What `fit(checkpoint_dir=)` saves and restores, and the folder's format on disk.

`checkpoint_folder.py` is the on-disk format (atomic publication, manifest
with CRC-32, retention); `run_checkpoint.py` decides when to save and runs
the asynchronous publication, restore with fallback and preemption;
`resume.py` is the run `fit` opens (`ResumableRun`, or `NoResume` with the
same methods as no-ops, so `fit` keeps one flow).

May import: the step, checks, inputs and plan rooms, tapeworks.errors and
tapeworks.fileio. The front (`engine/*.py`) passes the trainer's parts in.
"""
