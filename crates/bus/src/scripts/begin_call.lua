-- Records that ARGV[1] starts the call of a request, unless it was answered or is owned.
-- KEYS[1] answered mark, KEYS[2] call record (hash: owner, lease_until, entry, state),
-- KEYS[3] the entry's refusal mark (another toolbox of the fleet answered this entry already)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] retention ms, ARGV[4] entry id
-- Returns {state, entry}: 0 answered, 1 fresh, 2 started before (lease lapsed), 3 busy.
--
-- The lease rules follow, from call_lease.lua.
if redis.call('EXISTS', KEYS[1], KEYS[3]) > 0 then
  return {0, ''}
end
