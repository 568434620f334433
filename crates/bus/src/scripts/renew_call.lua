-- Extends ARGV[1]'s lease on a call and resets its entry's idle time (XCLAIM JUSTID does not
-- count a delivery).
-- KEYS[1] call record, KEYS[2] requests stream
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] group, ARGV[4] consumer, ARGV[5] entry id,
-- ARGV[6] '1' when the call has a record (tracked), '0' when it has none (a read-only,
-- idempotent tool): then only the entry's idle time is reset, as long as the entry is still
-- pending to ARGV[4] (so a replica that took it over is not robbed of it).
--
-- XCLAIM comes before HSET so renewal goes on while Redis is out of memory: a script without
-- flags is refused under OOM only at its first write, and only if that write may grow memory;
-- XCLAIM does not, and HSET then only rewrites a field in place.
local tracked = ARGV[6] ~= '0'
if tracked then
  if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
    return 0
  end
elseif #redis.call('XPENDING', KEYS[2], ARGV[3], ARGV[5], ARGV[5], 1, ARGV[4]) == 0 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XCLAIM', KEYS[2], ARGV[3], ARGV[4], 0, ARGV[5], 'JUSTID')
if tracked then
  redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[2]))
end
return 1
