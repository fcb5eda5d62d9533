"""The visible devices of a process that holds several accelerators, on Ray before 2.60.

placectl sets such a process's visible-devices variable itself (``CUDA_VISIBLE_DEVICES=2,3``
with Ray's switch ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``, see
:mod:`controller.state.environment`). Ray before 2.60 reads that variable as the process
starts and maps the device slots it assigns through it: slot 2 of the list ``2,3`` does
not exist, and the process dies at its first task with an IndexError in Ray's
``get_accelerator_ids_for_accelerator_resource``. Ray reads the variable once, when its
worker starts, before it runs the worker's setup hook; so on those releases the value
travels under another name (``PLACECTL_SET_CUDA_VISIBLE_DEVICES``) and Ray's setup hook
(:func:`set_devices`, named in the runtime environment as Ray names a job's
``worker_process_setup_hook``) sets it before the process's first task, as the process
would find it on Ray 2.60.

This module imports nothing but ``os``: it runs in every such process as it starts.
"""

from __future__ import annotations

import os

PREFIX = "PLACECTL_SET_"
# Ray's own variable for a worker's setup hook (ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR,
# the same name from Ray 2.48 to 2.60); a dotted path is imported and called.
HOOK_VARIABLE = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
HOOK = f"{__name__}.set_devices"
_NOSET = "RAY_EXPERIMENTAL_NOSET_"


def carried(variable: str, value: str) -> dict[str, str]:
    """The runtime-environment variables that give the process ``variable=value`` at its
    start instead of from Ray's runtime environment."""
    return {PREFIX + variable: value, HOOK_VARIABLE: HOOK}


def set_devices() -> None:
    """Ray's setup hook: set each variable carried under :data:`PREFIX` whose Ray switch
    says Ray does not set it. A child that inherits the carried value but has the switch
    off (an engine's child, whose device Ray sets) is left to Ray."""
    for key, value in list(os.environ.items()):
        if key.startswith(PREFIX):
            variable = key[len(PREFIX) :]
            if os.environ.get(_NOSET + variable, "").lower() in ("1", "true"):
                os.environ[variable] = value
