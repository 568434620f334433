-- The cluster form of ../begin_call.lua: the same lease rules, with the request's claim (a hash
-- in the requests stream's slot) in place of the answered mark.
-- KEYS[1] claim (hash: topic, state 'claimed' or 'answered', answer), KEYS[2] call record,
-- KEYS[3] the entry's refusal mark (its copy in the stream's slot); all in the stream's slot.
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] retention ms, ARGV[4] entry id
-- Returns {state, entry}: 0 answered, 1 fresh, 2 started before (lease lapsed), 3 busy.
--
-- A claim that is only 'claimed' is not an answer: its holder stopped between taking it and
-- publishing, or publishes now; the call record decides, as on one server.
if redis.call('HGET', KEYS[1], 'state') == 'answered' or redis.call('EXISTS', KEYS[3]) == 1 then
  return {0, ''}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
local prev = redis.call('HMGET', KEYS[2], 'owner', 'lease_until', 'entry', 'state')
local state = 1
if prev[1] then
  if prev[1] == ARGV[1] then
    redis.call('HSET', KEYS[2], 'lease_until', now + lease)
    return {tonumber(prev[4]) or 2, ''}
  end
  if tonumber(prev[2]) - math.floor(lease / 3) > now then
    return {3, prev[3]}
  end
  state = 2
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'lease_until', now + lease, 'entry', ARGV[4], 'state', state)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {state, ''}
