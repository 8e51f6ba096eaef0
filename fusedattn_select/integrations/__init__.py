"""Integrations of fusedattn-select into frameworks.

Each integration imports its framework only when used, so importing this package costs nothing:

- `fusedattn_select.integrations.transformers`: a Hugging Face transformers attention
  implementation named "fusedattn" (`register()`), and `report()` / `configs_from_hf()`, which
  say per layer of a model config which backend runs it and why.
- `fusedattn_select.integrations.sdpa`: a drop-in for torch's scaled_dot_product_attention
  (`install()`, `uninstall()`, `routed()`).
"""
