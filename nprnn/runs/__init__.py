"""A run: its options and config (runconfig.py), the training loop (train.py), its folder's files
and guards (runfolder.py, checkpoint.py)."""
