"""The engine side: what runs inside vLLM (no device code, no vLLM import at package import)."""
