from flash_attn.bert_padding import _cuda_only as all_gather  # noqa: F401
