-- Records that ARGV[1] starts the call of a request, unless it was answered or is owned.
-- KEYS[1] answered mark, KEYS[2] call record (hash: owner, lease_until, entry)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] retention ms, ARGV[4] entry id
-- Returns {state, entry}: 0 answered, 1 fresh, 2 started before (lease lapsed), 3 busy.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, ''}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prev = redis.call('HMGET', KEYS[2], 'owner', 'lease_until', 'entry')
local state = 1
if prev[1] then
  if prev[1] ~= ARGV[1] and tonumber(prev[2]) > now then
    return {3, prev[3]}
  end
  state = 2
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'lease_until', now + tonumber(ARGV[2]), 'entry', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {state, ''}
