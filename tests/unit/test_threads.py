"""Drivers read the table from many threads at once (a driver launching worker groups
in parallel did). msgspec builds a type's decoding information on first use, and
threads doing that at once crashed the process (a segfault, 36 of 40 fresh processes
with a short switch interval); ``controller.state.table.decode`` builds it once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    import threading

    import msgspec

    sys.setswitchinterval(1e-6)  # switch threads as often as possible

    from controller.planning.spec import load_spec
    from controller.state.records import ReservationRecord
    from controller.state.table import decode

    spec = load_spec({"num_nodes": 1, "component_placement": {"actor": "0"}})
    data = msgspec.msgpack.encode(ReservationRecord(job="j", uid="u", spec=spec))
    start = threading.Barrier(8)

    def read():
        start.wait()
        for _ in range(3):
            assert decode(data, ReservationRecord, "record").job == "j"

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("ok")
    """
)


def test_first_reads_of_a_record_from_many_threads_at_once():
    for _ in range(5):  # a fresh process each time: the race is in first use
        done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
