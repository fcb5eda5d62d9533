import uuid


def random_uuid() -> str:
    """vllm.utils.random_uuid, imported by OpenRLHF's engine module."""
    return uuid.uuid4().hex
