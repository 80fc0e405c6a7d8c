-- wrk script: single creates, each with its own Idempotency-Key.
-- Set by the harness: API_KEY and KEY_PREFIX in the environment.
-- Each wrk thread runs its own copy of this script; `thread_id` is set in each by setup().
local counter = 0
local threads = {}

function setup(thread)
  thread:set("thread_id", #threads)
  table.insert(threads, thread)
end

function init(args)
  api_key = os.getenv("API_KEY")
  prefix = os.getenv("KEY_PREFIX") or "bench"
  body = '{"channel": "email", "recipient": "bench@example.com", "subject": "Hi", "body": "Your code is 123456"}'
end

function request()
  counter = counter + 1
  local headers = {
    ["Authorization"] = "Api-Key " .. api_key,
    ["Idempotency-Key"] = prefix .. "-" .. thread_id .. "-" .. counter,
    ["Content-Type"] = "application/json",
  }
  return wrk.format("POST", "/api/v1/notifications", headers, body)
end

function response(status, headers, body)
  if status ~= 201 then
    errors_non201 = (errors_non201 or 0) + 1
  end
end

function done(summary, latency, requests)
  local non201 = 0
  for _, t in ipairs(threads) do
    non201 = non201 + (t:get("errors_non201") or 0)
  end
  io.write(string.format("RESULT requests=%d non201=%d duration_us=%d p50_us=%d p99_us=%d\n",
    summary.requests, non201, summary.duration,
    latency:percentile(50), latency:percentile(99)))
end
