"""Reading a trace store: gzip (one member per record) against plain JSONL, same records, same run.

    python benchmarks/trace_store_read.py [--records 4000]

Prints the read time of each, the ratio, and the peak Python memory of the gzip read (tracemalloc):
reading must stay linear in the file and never hold the whole file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "traces"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=4000)
    ns = parser.parse_args()
    from test_traces import full_trace

    from envace_mcp.traces import TraceStore

    with tempfile.TemporaryDirectory() as folder:
        stores = {"plain": TraceStore(Path(folder) / "plain"), "gzip": TraceStore(Path(folder) / "gzip", compress=True)}
        for i in range(ns.records):
            trace = full_trace(run_id=f"run-{i}")
            for store in stores.values():
                store.append(trace)
        seconds, peak = {}, 0
        for name, store in stores.items():
            tracemalloc.start()
            started = time.perf_counter()
            count = sum(1 for _ in store.read())
            seconds[name] = time.perf_counter() - started
            peak = tracemalloc.get_traced_memory()[1] if name == "gzip" else peak
            tracemalloc.stop()
            assert count == ns.records
        size = stores["gzip"].path.stat().st_size
        print(f"{ns.records} records: plain {seconds['plain']:.2f} s, gzip {seconds['gzip']:.2f} s "
              f"({seconds['gzip'] / seconds['plain']:.2f}x plain); gzip file {size / 1e6:.1f} MB, "
              f"peak Python memory while reading it {peak / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
