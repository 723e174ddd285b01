"""`python -m hacrl.cli ...` is the `hacrl` command."""

import sys

from hacrl.cli.main import main

sys.exit(main())
