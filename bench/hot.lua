-- SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
-- bench/hot.lua - wrk script for the hot-key runs: wrk's own static
-- request (every connection asks for the same URI, given on the command
-- line), plus one line "WRKJSON {...}" at the end with the exact counts
-- and latencies (microseconds) for bench/bench.pl.

function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
        '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
        '"p50_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%d}\n',
        summary.requests, summary.duration, summary.bytes,
        e.connect, e.read, e.write, e.status, e.timeout,
        latency:percentile(50), latency:percentile(99), latency.max,
        latency.mean))
end
