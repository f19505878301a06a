import sys

from experiments.fuzz.driver import main

sys.exit(main())
