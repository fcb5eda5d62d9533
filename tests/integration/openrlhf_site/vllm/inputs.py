class TokensPrompt(dict):
    """vllm.inputs.TokensPrompt, imported by OpenRLHF's engine module."""
