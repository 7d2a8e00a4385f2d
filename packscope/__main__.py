import sys

from packscope.commands.cli import main

sys.exit(main())
