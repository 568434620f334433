-- A token bucket shared by every replica (`[auth] shared_limits`): takes one token, refilled at
-- a rate, up to a burst, on the server's clock so replicas' clocks do not matter.
-- KEYS[1] the bucket (a hash: tokens, at); ARGV[1] tokens a second, ARGV[2] burst.
-- Returns 0 when a token was taken, else the milliseconds until one will be there.
--
-- TIME is non-deterministic; Redis 5+ replicates a script's effects, not the script, so the
-- replicas get the HSET it made.
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(state[1]), tonumber(state[2])
if not tokens or not at then
  tokens, at = burst, now_ms
end
if now_ms > at then
  tokens = math.min(burst, tokens + (now_ms - at) * rate / 1000)
  at = now_ms
end
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(at))
-- A bucket left alone refills whole within burst / rate seconds; it is not needed after that.
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return wait
