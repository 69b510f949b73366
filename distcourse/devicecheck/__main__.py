"""`python -m distcourse.devicecheck [PATH ...]`: see the package's doc."""

from distcourse.devicecheck.sources import main

raise SystemExit(main())
