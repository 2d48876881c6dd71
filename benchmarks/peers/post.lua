-- wrk script of `make bench-peers`: every connection POSTs the same body, and `done` prints one
-- machine-readable line (WRK_JSON {...}) with wrk's exact counters and percentiles, so the
-- harness does not have to trust the rounded text summary.
-- Usage: wrk -t T -c C -d D -s post.lua URL -- BODY_FILE [CONTENT_TYPE ["Name: value" ...]]

function init(args)
  local path = args[1]
  if path == nil then
    error("post.lua needs the body file: wrk ... -s post.lua URL -- BODY_FILE")
  end
  local f = assert(io.open(path, "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = args[2] or "application/json"
  for i = 3, #args do
    local name, value = string.match(args[i], "^([^:]+):%s*(.*)$")
    if name == nil then
      error("post.lua: a header must be 'Name: value', got " .. args[i])
    end
    wrk.headers[name] = value
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"min":%d,"mean":%.1f,"stdev":%.1f,"max":%d,"p50":%d,"p90":%d,"p99":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.stdev, latency.max,
    latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
