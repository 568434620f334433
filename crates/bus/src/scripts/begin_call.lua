-- Records that ARGV[1] starts the call of a request, unless it was answered or is owned.
-- KEYS[1] answered mark, KEYS[2] call record (hash: owner, lease_until, entry, state),
-- KEYS[3] the entry's refusal mark (another toolbox of the fleet answered this entry already)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] retention ms, ARGV[4] entry id
-- Returns {state, entry}: 0 answered, 1 fresh, 2 started before (lease lapsed), 3 busy; when
-- the request was answered by another entry and its answer is kept in the mark
-- (`<answer id>\n<entry id>\n<payload>`, see finish.lua), {0, '', mark}, so the caller can
-- answer this retry with the original answer.
--
-- The lease rules follow, from call_lease.lua.
-- An entry already answered (its refusal mark) gets nothing more, kept answer or not.
local marks = redis.call('MGET', KEYS[1], KEYS[3])
if marks[2] then
  return {0, ''}
end
if marks[1] then
  local at = string.find(marks[1], '\n', 1, true)
  if at and string.sub(marks[1], at + 1, at + #ARGV[4] + 1) ~= ARGV[4] .. '\n' then
    return {0, '', marks[1]}
  end
  return {0, ''}
end
