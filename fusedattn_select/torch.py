"""Alias of `fusedattn_select.integrations.sdpa`, the torch SDPA drop-in (kept for existing imports)."""

import sys

from fusedattn_select.integrations import sdpa

sys.modules[__name__] = sdpa
