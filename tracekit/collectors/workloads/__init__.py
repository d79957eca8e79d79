"""Built-in real workloads, one module each (``tp``: Megatron-style tensor parallel)."""
