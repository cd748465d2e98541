"""The vast.ai-compatible API (/api/v0/): vast's paths and shapes over our services, so the
official ``vastai`` CLI and SDK drive this marketplace (issue 16)."""
