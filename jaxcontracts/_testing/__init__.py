"""Testing: snapshots, snapshot files, the recorder and the pytest plugin."""
