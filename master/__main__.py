import sys

from sockherd.master.cli import main

sys.exit(main())
