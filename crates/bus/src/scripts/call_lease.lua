-- The lease part of begin_call.lua and cluster/begin_call.lua, appended to each after its own
-- test for "answered": records that ARGV[1] starts the call unless a live owner holds it.
-- KEYS[2] call record (hash: owner, lease_until, entry, state)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] retention ms, ARGV[4] entry id
--
-- Holders renew every third of the lease, so a live one always has more than two thirds left;
-- a lease with less than a third left counts as lapsed (its holder missed renewals).
-- The same owner again is a retry after a lost reply: it gets the state it got then.
-- Returns {state, entry}: {2, earlier owner} when its lease lapsed, {3, entry} when it holds it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local prev = redis.call('HMGET', KEYS[2], 'owner', 'lease_until', 'entry', 'state')
local state, holder = 1, ''
if prev[1] then
  if prev[1] == ARGV[1] then
    redis.call('HSET', KEYS[2], 'lease_until', now + lease)
    return {tonumber(prev[4]) or 2, ''}
  end
  if tonumber(prev[2]) - math.floor(lease / 3) > now then
    return {3, prev[3]}
  end
  state, holder = 2, prev[1]
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'lease_until', now + lease, 'entry', ARGV[4], 'state', state)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {state, holder}
