"""`python -m hacrl.checkpoint upgrade <step folder>...`: see `hacrl.checkpoint.team.main`."""

from hacrl.checkpoint.team import main

main()
