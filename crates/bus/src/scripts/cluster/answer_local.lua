-- Cluster finish in one step, when the answer's topic shares the requests stream's slot (a
-- results topic per shard): the common end of a call, a final answer and nothing else, runs
-- claim.lua, publish.lua and settle.lua's work for it as one script on one node. Being atomic,
-- it never leaves the claim `claimed`: it reads the claim, publishes, and records it `answered`.
-- KEYS[1] requests stream, KEYS[2] claim, KEYS[3] call record, KEYS[4] the entry's refusal mark
-- (copy in this slot), KEYS[5] answer topic, KEYS[6] the answered mark next to it,
-- KEYS[7] the entry's refusal mark next to it (all in one slot)
-- ARGV[1] group, ARGV[2] entry id, ARGV[3] maxlen, ARGV[4] retention ms, ARGV[5] answer id,
-- ARGV[6] payload, ARGV[7] what to keep for retries ('' for nothing), ARGV[8] '1' when the
-- ledger is of format 2 on every replica (claim.lua's ARGV[12]), ARGV[9] '1' when the call may
-- have a call record to delete
-- Returns as answer_batch.lua does for an item: 1 published (now, or by an earlier run of this
-- finish), 0 answered before or the claim held for another topic (acked unanswered), -1 the
-- topic holds a key that is not a stream (nothing written, the entry stays pending), {2, mark}
-- the request was answered by another entry whose answer is kept (nothing written, the entry
-- stays pending for its replay).
local entry, id, keep = ARGV[2], ARGV[5], ARGV[7] ~= ''
local held = redis.call('HMGET', KEYS[2], 'topic', 'state', 'answer', 'entry', 'kept', 'refused')
local refused = false
if ARGV[8] ~= '1' or held[6] then
  refused = redis.call('GET', KEYS[4])
end
if held[2] == 'answered' and not refused and keep and held[5] and held[4] and held[4] ~= entry
    and held[3] ~= id then
  return {2, (held[3] or '') .. '\n' .. held[4] .. '\n' .. held[5]}
end
local published = 0
local claim = 0
if held[2] == 'answered' or refused then
  claim = 1
  if held[3] == id or refused == id then
    published = 1
  end
elseif held[1] and held[1] ~= KEYS[5] then
  -- A copy of the request named another topic, and that one gets the answer.
  claim = 2
end
if claim == 0 then
  local marks = redis.call('MGET', KEYS[6], KEYS[7])
  local final_on_topic = true
  if marks[1] then
    published = marks[1] == id and 1 or 0
  elseif marks[2] then
    -- This entry's refusal is on the topic: its one answer.
    published = marks[2] == id and 1 or 0
    final_on_topic = false
  else
    if add_answer(KEYS[5], ARGV[3], id, ARGV[6]) == -1 then
      return -1
    end
    redis.call('SET', KEYS[6], id, 'PX', ARGV[4])
    published = 1
  end
  if final_on_topic then
    local fields = {'topic', KEYS[5], 'state', 'answered'}
    if published == 1 then
      fields[5], fields[6], fields[7], fields[8] = 'answer', id, 'entry', entry
      if keep then
        fields[9], fields[10] = 'kept', ARGV[7]
      end
    end
    redis.call('HSET', KEYS[2], unpack(fields))
    redis.call('PEXPIRE', KEYS[2], ARGV[4])
  end
end
if claim ~= 2 and ARGV[9] == '1' then
  redis.call('DEL', KEYS[3])
end
-- A missing group (Redis lost its data) fails the ack; what was published still stands.
redis.pcall('XACK', KEYS[1], ARGV[1], entry)
return published
