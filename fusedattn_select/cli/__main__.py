"""`python -m fusedattn_select.cli`: the same as the `fusedattn-select` command."""

import sys

from fusedattn_select.cli.main import main

sys.exit(main())
