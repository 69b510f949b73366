"""`python -m distcourse.plan ...`: see distcourse.plan.cli."""

import sys

from distcourse.plan.cli import main

if __name__ == "__main__":
    sys.exit(main())
