import sys

from packscope.cli import main

sys.exit(main())
