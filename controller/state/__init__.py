"""Records and their pure derivations: what the controller persists, and everything it
computes from a plan and those records (slots, assignments, worker environments, the
port ledger, status, spares). Imports no Ray.

``records`` and ``ports`` hold the persisted Structs; ``plan`` turns a placement into a
job plan and its node slots; ``assignments`` and ``environment`` derive what each
process needs; ``table`` is the storage format (keys, versions, migrations).
"""
