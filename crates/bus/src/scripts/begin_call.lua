-- Records that ARGV[1] starts the call of a request, unless it was answered or is owned.
-- KEYS[1] answered mark, KEYS[2] call record (hash: owner, lease_until, entry, state),
-- KEYS[3] the entry's refusal mark (another toolbox of the fleet answered this entry already)
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] retention ms, ARGV[4] entry id,
-- ARGV[5] '1' when the ledger is of format 2 on every replica: an answered mark that is not
-- there means no entry of the request was answered, and the refusal mark is not looked up
-- Returns {state, entry}: 0 answered, 1 fresh, 2 started before (lease lapsed), 3 busy; when
-- the request was answered by another entry and its answer is kept in the mark
-- (`<answer id>\n<entry id>\n<payload>`, see finish.lua), {0, '', mark}, so the caller can
-- answer this retry with the original answer.
--
-- The lease rules follow, from call_lease.lua.
-- An entry already answered (its refusal mark) gets nothing more, kept answer or not. A mark
-- that is the placeholder `refused` (format 2) is no answer.
local mark, refused
if ARGV[5] == '1' then
  mark = redis.call('GET', KEYS[1])
  refused = mark and redis.call('EXISTS', KEYS[3]) == 1
else
  local marks = redis.call('MGET', KEYS[1], KEYS[3])
  mark, refused = marks[1], marks[2]
end
if refused then
  return {0, ''}
end
if mark == 'refused' then
  mark = false
end
if mark then
  local at = string.find(mark, '\n', 1, true)
  if at and string.sub(mark, at + 1, at + #ARGV[4] + 1) ~= ARGV[4] .. '\n' then
    return {0, '', mark}
  end
  return {0, ''}
end
