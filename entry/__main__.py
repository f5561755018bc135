"""`python -m sockherd`: the `sockherd` command (uvicorn and gunicorn both
run this way). The folder is the `sockherd` namespace's own portion (no
__init__.py: each layer's folder is mapped onto sockherd.<name>,
pyproject.toml); it holds this entry point alone."""
import sys

from sockherd.master.cli import main

sys.exit(main())
