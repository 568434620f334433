-- The cluster form of ../begin_call.lua: the same lease rules, with the request's claim (a hash
-- in the requests stream's slot) in place of the answered mark.
-- KEYS[1] claim (hash: topic, state 'claimed' or 'answered', answer), KEYS[2] call record,
-- KEYS[3] the entry's refusal mark (its copy in the stream's slot); all in the stream's slot.
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] retention ms, ARGV[4] entry id
-- Returns {state, entry}: 0 answered, 1 fresh, 2 started before (lease lapsed), 3 busy.
--
-- A claim that is only 'claimed' is not an answer: its holder stopped between taking it and
-- publishing, or publishes now; the call record decides, as on one server (call_lease.lua,
-- appended).
if redis.call('HGET', KEYS[1], 'state') == 'answered' or redis.call('EXISTS', KEYS[3]) == 1 then
  return {0, ''}
end
