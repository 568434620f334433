-- Cluster finish, step 1, in the requests stream's slot: take the request's claim for the answer's
-- topic, and see whether the entry is still pending.
-- KEYS[1] requests stream, KEYS[2] claim (topic, state, answer, ...: a hash, or in ledger format
-- 3 a string, see claim_value.lua, prepended), KEYS[3] the entry's
-- refusal mark (copy in this slot)
-- ARGV[1] group, ARGV[2] entry id, ARGV[3] '1' when the request is identified (KEYS[2], KEYS[3]
-- are real), ARGV[4] '1' when there is an answer, ARGV[5] '1' when it is final,
-- ARGV[6] the answer's topic (full key), ARGV[7] retention ms, ARGV[8] '1' when there is a dead
-- letter (only then is the pending state looked up), ARGV[9] the answer's id,
-- ARGV[10] '1' when the answer replays a kept answer for a retry (only the entry's refusal mark
-- guards it: the claim is the original's), ARGV[11] '1' when the finish keeps its final answer
-- for retries, ARGV[12] '1' when the ledger is of format 2 on every replica: a claim without the
-- field `refused` means no entry of the request was refused, and the refusal mark is not read,
-- ARGV[13] '1' when the ledger writes format 2, '3' when it writes format 3: an answer that is
-- not final notes itself in the claim (field `refused`) here, before it is published next to its
-- topic, so the note is there as long as any refusal mark of the request is (answer_local.lua
-- then skips the marks next to the topic when the claim is empty; settle.lua notes it again with
-- the refusal mark's copy); a claim this step creates is a string in format 3, a hash otherwise,
-- and a claim already there keeps its shape
-- Returns {claim, pending, own, taken}, or {3, pending, 0, 0, mark}:
--   claim 0: publish (the claim is this topic's now, or the answer is not final);
--         1: the request (or this entry) was answered already: publish nothing;
--         2: the claim names another response topic: a copy of the request asked for its answer
--            elsewhere, and that one gets it; publish nothing.
--   pending 1 still pending, 0 not pending, -1 the group is gone;
--         3: the request was answered by another entry whose answer is kept (the mark as
--            one server keeps it, `<answer id>\n<entry id>\n<kept>`), and this final answer
--            keeps its own: write nothing, the entry stays pending to be answered with it.
--   own 1 when the recorded answer is this very answer (a retry of this finish);
--   taken 1 when this call took the claim (only then may this finish give it back).
--
-- Only a final answer takes the claim: a refusal (not final) leaves a caller free to retry the
-- request, with another response topic too.
local identified, has_answer, final = ARGV[3] == '1', ARGV[4] == '1', ARGV[5] == '1'
local replay, keep = ARGV[10] == '1', ARGV[11] == '1'
local pending = 1
if ARGV[8] == '1' then
  local found = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
  if type(found) == 'table' and found.err then
    pending = -1
  elseif #found == 0 then
    pending = 0
  end
end
local claim, own, taken = 0, 0, 0
if identified and has_answer then
  local strings = ARGV[13] == '3'
  local held, shape = read_claim(KEYS[2], strings)
  local as_string = shape or (shape == nil and strings)
  local refused = false
  if ARGV[12] ~= '1' or held[6] then
    refused = redis.call('GET', KEYS[3])
  end
  if replay then
    if refused then
      claim = 1
      if refused == ARGV[9] then own = 1 end
    end
    return {claim, pending, own, taken}
  end
  if held[2] == 'answered' and not refused and keep and final and held[5] and held[4]
      and held[4] ~= ARGV[2] and held[3] ~= ARGV[9] then
    return {3, pending, 0, 0, (held[3] or '') .. '\n' .. held[4] .. '\n' .. held[5]}
  end
  if held[2] == 'answered' or refused then
    claim = 1
    if held[3] == ARGV[9] or refused == ARGV[9] then own = 1 end
  elseif held[1] and held[1] ~= ARGV[6] then
    if final then claim = 2 end
  elseif final and not held[1] then
    if as_string then
      redis.call('SET', KEYS[2], claim_value(ARGV[6], 'claimed', held[3], held[4], held[5], held[6]),
        'PX', ARGV[7])
    else
      redis.call('HSET', KEYS[2], 'topic', ARGV[6], 'state', 'claimed')
      redis.call('PEXPIRE', KEYS[2], ARGV[7])
    end
    taken = 1
  end
  if claim == 0 and not final and ARGV[13] ~= '0' then
    if as_string then
      redis.call('SET', KEYS[2], claim_value(held[1], held[2], held[3], held[4], held[5], true), 'PX', ARGV[7])
    else
      redis.call('HSET', KEYS[2], 'refused', '1')
      redis.call('PEXPIRE', KEYS[2], ARGV[7])
    end
  end
end
return {claim, pending, own, taken}
