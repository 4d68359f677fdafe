-- SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
-- bench/unique.lua - wrk script: every request has a URI never asked before,
-- so nothing can be collapsed or cached.  Used by bench/bench.pl:
--
--   wrk -t2 -c200 -d4s -s bench/unique.lua http://127.0.0.1:PORT/ \
--       -- /u/RUNID 'delay=0&size=10000'
--
-- args[1]: path prefix (unique per run), args[2]: query string.
-- Requests go to PREFIX-THREAD-N?QUERY.  At the end one line
-- "WRKJSON {...}" carries the exact counts and latencies (microseconds).

local threads = 0

function setup(thread)
    threads = threads + 1
    thread:set("tid", threads)
end

local prefix, query, counter = "/u", "", 0

function init(args)
    prefix = args[1] or prefix
    query = args[2] or query
end

function request()
    counter = counter + 1
    return wrk.format(nil, string.format("%s-%d-%d?%s", prefix, tid, counter,
                                         query))
end

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
