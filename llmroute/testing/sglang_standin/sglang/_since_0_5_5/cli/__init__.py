"""``sglang.cli``: present from SGLang 0.5.5 on (the ``sglang`` console command)."""
