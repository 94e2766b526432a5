"""The real-engine benchmark: policies side by side on one vLLM engine (``specctl bench
--engine vllm``), and the workload files it runs."""
