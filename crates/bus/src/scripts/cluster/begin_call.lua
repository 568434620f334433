-- The cluster form of ../begin_call.lua: the same lease rules, with the request's claim (a hash,
-- or in ledger format 3 a string, in the requests stream's slot) in place of the answered mark.
-- KEYS[1] claim (topic, state 'claimed' or 'answered', answer, ...: a hash, or in ledger format 3
-- a string, see claim_value.lua, prepended), KEYS[2] call record,
-- KEYS[3] the entry's refusal mark (its copy in the stream's slot); all in the stream's slot.
-- ARGV[1] owner, ARGV[2] lease ms, ARGV[3] retention ms, ARGV[4] entry id,
-- ARGV[5] '1' when the ledger is of format 2 on every replica: a claim without the field
-- `refused` means no entry of the request was refused, and the refusal mark is not looked up;
-- '3' when it is of format 3 on every replica (as '1', and the claim is read as a string first)
-- Returns {state, entry}: 0 answered, 1 fresh, 2 started before (lease lapsed), 3 busy; when
-- the request was answered by another entry and its answer is kept in the claim (fields
-- `answer`, `entry`, `kept`, see settle.lua), {0, '', mark} with the mark as one server keeps
-- it (`<answer id>\n<entry id>\n<kept>`), so the caller can answer this retry with it.
--
-- A claim that is only 'claimed' is not an answer: its holder stopped between taking it and
-- publishing, or publishes now; the call record decides, as on one server (call_lease.lua,
-- appended).
-- An entry already answered (its refusal mark) gets nothing more, kept answer or not. Ledger
-- format 2 also sets the claim's field `refused` with every refusal mark (settle.lua).
local held = read_claim(KEYS[1], ARGV[5] == '3')
if (ARGV[5] == '0' or held[6]) and redis.call('EXISTS', KEYS[3]) == 1 then
  return {0, ''}
end
if held[2] == 'answered' then
  if held[5] and held[4] and held[4] ~= ARGV[4] then
    return {0, '', (held[3] or '') .. '\n' .. held[4] .. '\n' .. held[5]}
  end
  return {0, ''}
end
