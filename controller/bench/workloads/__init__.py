"""Workload files shipped with specctl: ``specctl bench --engine vllm --workload NAME``."""
