import sys

from autofuse.cli import main

sys.exit(main())
