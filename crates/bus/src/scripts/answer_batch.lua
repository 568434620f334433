-- Ends a batch of entries of one stream and group that each publish a final answer: the common
-- end of a call, and leaner than finish.lua, which handles every other end (refusals, dead
-- letters, answer copies, entries of unidentified requests).
-- KEYS[1] requests stream; then for item i, from k = 1 + (i - 1) * 4:
--   KEYS[k + 1] answered mark, KEYS[k + 2] the entry's refusal mark, KEYS[k + 3] call record,
--   KEYS[k + 4] answer topic
-- ARGV[1] group, ARGV[2] maxlen, ARGV[3] retention ms; then for item i, from a = 3 + (i - 1) * 5:
--   ARGV[a + 1] entry id, ARGV[a + 2] answer id, ARGV[a + 3] answer payload,
--   ARGV[a + 4] '1' when the call wrote a call record (deleted here), '0' when it did not,
--   ARGV[a + 5] what to keep of the answer for retries ('' for nothing): the mark is then
--   `<answer id>\n<entry id>\n<kept>`
-- Returns one reply per item, as finish.lua: 1 when the answer is the one published for the
-- request (now, or by an earlier run of this same batch whose reply was lost), 0 when the
-- request or the entry was answered before, -1 when the answer topic holds a key that is not a
-- stream; or {0, error} when Redis refused a write of the item. After -1 or an error nothing of
-- the item stays written and its entry stays pending; the other items go on.
-- An item that keeps answers and finds the request answered by another entry, with that answer
-- kept, gets {2, mark}: nothing is written and its entry stays pending, for the caller to answer
-- it with the original answer (finish.lua's replay).
--
-- The answered mark is taken with one `SET NX GET`: nil means this item set it. A run cut short
-- (the script killed, the server gone) leaves the items before it published and marked but the
-- batch unacked; running the batch again publishes none of them twice (their marks begin with
-- their own answer ids) and acks them all, with one XACK.
-- Whether `mark` keeps an answer given to an entry other than `entry` (a retry, not this entry
-- answered by another holder or another toolbox).
local function kept_by_other(mark, entry)
  local at = string.find(mark, '\n', 1, true)
  return at ~= nil and string.sub(mark, at + 1, at + #entry + 1) ~= entry .. '\n'
end
local n = (#ARGV - 3) / 5
local replies = {}
local acked = {}
for i = 1, n do
  local k, a = 1 + (i - 1) * 4, 3 + (i - 1) * 5
  local id = ARGV[a + 2]
  local keep = ARGV[a + 5] ~= ''
  local reply
  local mark = id
  if keep then
    mark = id .. '\n' .. ARGV[a + 1] .. '\n' .. ARGV[a + 5]
  end
  local before = redis.pcall('SET', KEYS[k + 1], mark, 'NX', 'GET', 'PX', ARGV[3])
  if type(before) == 'table' and before.err then
    reply = {0, before.err}
  elseif before then
    if string.sub(before, 1, #id) == id then
      reply = 1
    elseif keep and kept_by_other(before, ARGV[a + 1]) and redis.call('EXISTS', KEYS[k + 2]) == 0 then
      reply = {2, before}
    else
      reply = 0
    end
  elseif redis.call('EXISTS', KEYS[k + 2]) == 1 then
    -- Another toolbox answered this entry with a refusal: that stays its one answer.
    redis.call('DEL', KEYS[k + 1])
    reply = 0
  else
    local added = redis.pcall('XADD', KEYS[k + 4], 'MAXLEN', '~', ARGV[2], '*', 'id', id, 'payload', ARGV[a + 3])
    if type(added) == 'table' and added.err then
      -- Nothing of this item may stay written.
      redis.call('DEL', KEYS[k + 1])
      if string.sub(added.err, 1, 9) == 'WRONGTYPE' then
        reply = -1
      else
        reply = {0, added.err}
      end
    else
      reply = 1
    end
  end
  if reply == 0 or reply == 1 then
    if ARGV[a + 4] == '1' then
      redis.call('DEL', KEYS[k + 3])
    end
    acked[#acked + 1] = ARGV[a + 1]
  end
  replies[i] = reply
end
if #acked > 0 then
  -- A missing group (Redis lost its data) fails the ack; the answers above still stand.
  redis.pcall('XACK', KEYS[1], ARGV[1], unpack(acked))
end
return replies
