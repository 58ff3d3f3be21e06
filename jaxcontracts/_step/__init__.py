"""Hot steps: the decorator, analysis, the compiled signature, the call
path, diagnosis, ``jc.check``."""
