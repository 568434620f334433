-- Ends a batch of entries of one stream and group that each publish a final answer: the common
-- end of a call, and leaner than finish.lua, which handles every other end (refusals, dead
-- letters, answer copies, entries of unidentified requests).
-- KEYS[1] requests stream; then for each item, three keys, or four when its call wrote a call
-- record: answered mark, the entry's refusal mark, answer topic[, call record]
-- ARGV[1] group, ARGV[2] maxlen, ARGV[3] retention ms, ARGV[4] '1' when the ledger is of
-- format 2 on every replica (an answered mark that is not there means no entry of the request was
-- answered, so the entry's refusal mark is not looked up); then for item i, from
-- a = 4 + (i - 1) * 5:
--   ARGV[a + 1] entry id, ARGV[a + 2] answer id, ARGV[a + 3] answer payload,
--   ARGV[a + 4] '1' when the call wrote a call record (its key follows the item's other three,
--   and it is deleted here), '0' when it did not (the item has three keys),
--   ARGV[a + 5] what to keep of the answer for retries ('' for nothing): the mark is then
--   `<answer id>\n<entry id>\n<kept>`
-- Returns one reply per item, as finish.lua: 1 when the answer is the one published for the
-- request (now, or by an earlier run of this same batch whose reply was lost), 0 when the
-- request or the entry was answered before, -1 when the answer topic holds a key that is not a
-- stream; or {0, error} when Redis refused the item's answer. After -1 or an error nothing of
-- the item stays written and its entry stays pending; the other items go on.
-- An item that keeps answers and finds the request answered by another entry, with that answer
-- kept, gets {2, mark}: nothing is written and its entry stays pending, for the caller to answer
-- it with the original answer (finish.lua's replay).
--
-- The answered mark is taken with one `SET NX GET`: nil means this item set it. A mark that is
-- the placeholder `refused` (ledger format 2: entries of the request were refused, none answered
-- for good) is no answer: the entry's refusal mark decides, and the final mark replaces it. It is a plain
-- `redis.call`: the marks are the ledger's own string keys, so the only errors it can meet are
-- the server's state (out of memory, a replica, a failed save), which Redis reports only at the
-- first write of a script, before anything is written, and which fail the whole call as
-- retryable; a mark of another type (written by something other than toolhost) fails the whole
-- call too, and the bus then runs each item of the batch on its own, so it fails alone. The
-- answer's `XADD` to a caller-named topic stays under `redis.pcall`.
-- A run cut short (the script killed, the server gone, an error) leaves the items before it
-- published and marked but the batch unacked; running the batch (or its items) again publishes
-- none of them twice (their marks begin with their own answer ids) and acks them.
-- Whether `mark` keeps an answer given to an entry other than `entry` (a retry, not this entry
-- answered by another holder or another toolbox).
local function kept_by_other(mark, entry)
  local at = string.find(mark, '\n', 1, true)
  return at ~= nil and string.sub(mark, at + 1, at + #entry + 1) ~= entry .. '\n'
end
local trusted = ARGV[4] == '1'
local n = (#ARGV - 4) / 5
local replies = {}
local acked = {}
local k = 1
for i = 1, n do
  local a = 4 + (i - 1) * 5
  local mark_key, refusal_key, topic = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local record_key = nil
  if ARGV[a + 4] == '1' then
    record_key = KEYS[k + 4]
    k = k + 4
  else
    k = k + 3
  end
  local entry, id = ARGV[a + 1], ARGV[a + 2]
  local keep = ARGV[a + 5] ~= ''
  local reply
  local mark = id
  if keep then
    mark = id .. '\n' .. entry .. '\n' .. ARGV[a + 5]
  end
  local before = redis.call('SET', mark_key, mark, 'NX', 'GET', 'PX', ARGV[3])
  if before == 'refused' then
    -- Entries of this request were refused, none answered for good: unless this entry was,
    -- the answer goes out and its mark replaces the placeholder (after the answer, so an answer
    -- Redis refuses leaves the placeholder as it was).
    if redis.call('EXISTS', refusal_key) == 1 then
      reply = 0
    else
      reply = add_answer(topic, ARGV[2], id, ARGV[a + 3], true)
      if reply == nil then
        redis.call('SET', mark_key, mark, 'PX', ARGV[3])
        reply = 1
      end
    end
  elseif before then
    if string.sub(before, 1, #id) == id then
      reply = 1
    elseif keep and kept_by_other(before, entry) and redis.call('EXISTS', refusal_key) == 0 then
      reply = {2, before}
    else
      reply = 0
    end
  elseif not trusted and redis.call('EXISTS', refusal_key) == 1 then
    -- Another toolbox answered this entry with a refusal: that stays its one answer.
    redis.call('DEL', mark_key)
    reply = 0
  else
    reply = add_answer(topic, ARGV[2], id, ARGV[a + 3], true)
    if reply == nil then
      reply = 1
    else
      -- Nothing of this item may stay written.
      redis.call('DEL', mark_key)
    end
  end
  if reply == 0 or reply == 1 then
    if record_key then
      redis.call('DEL', record_key)
    end
    acked[#acked + 1] = entry
  end
  replies[i] = reply
end
if #acked > 0 then
  -- A missing group (Redis lost its data) fails the ack; the answers above still stand.
  redis.pcall('XACK', KEYS[1], ARGV[1], unpack(acked))
end
return replies
