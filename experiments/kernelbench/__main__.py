import sys

from experiments.kernelbench.run import main

sys.exit(main())
