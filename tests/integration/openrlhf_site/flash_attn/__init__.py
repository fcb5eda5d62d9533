"""A stand-in for flash_attn (CUDA only): the names OpenRLHF 0.11.2's ring-attention
module imports. Calling one fails; nothing in placectl's tests does."""
