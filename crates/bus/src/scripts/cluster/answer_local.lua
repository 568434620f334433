-- Cluster finish in one step, for a batch of entries of one requests stream and group whose
-- answers' topics share the stream's slot (a results topic per shard): the common end of a call,
-- a final answer and nothing else, runs claim.lua, publish.lua and settle.lua's work for each
-- item in one script on one node, and one XACK acks every entry it settles. Being atomic, it
-- never leaves a claim `claimed`: it reads the claim, publishes, and records it `answered`.
-- Written for batches (crates/bus/src/batch.rs, `Batcher::for_batches`), like answer_batch.lua.
-- KEYS[1] requests stream; then for each item five keys, or six when its call may have written a
-- call record, all in the stream's slot: claim, the entry's refusal mark (copy in this slot),
-- answer topic, the answered mark next to it, the entry's refusal mark next to it[, call record]
-- ARGV[1] group, ARGV[2] maxlen, ARGV[3] retention ms, ARGV[4] the ledger's format: '0' format 1
-- (or 2 rolling from 1), '1' format 2 on every replica (claim.lua's ARGV[12]; also 3 rolling from
-- 2), '3' format 3 on every replica (new claims are strings, claim_value.lua, prepended); then
-- for item i, from a = 4 + (i - 1) * 5:
--   ARGV[a + 1] entry id, ARGV[a + 2] answer id, ARGV[a + 3] payload,
--   ARGV[a + 4] '1' when the item carries the call record's key (deleted here),
--   ARGV[a + 5] what to keep for retries ('' for nothing)
-- Returns one reply per item, as answer_batch.lua: 1 published (now, or by an earlier run of this
-- finish), 0 answered before or the claim held for another topic (acked unanswered), -1 the
-- topic holds a key that is not a stream (nothing written, the entry stays pending), {2, mark}
-- the request was answered by another entry whose answer is kept (nothing written, the entry
-- stays pending for its replay), {0, error} Redis refused the answer's XADD (nothing written,
-- the entry stays pending).
--
-- The claim is the request's answered mark here: this script never sets the mark next to the
-- topic (the same slot, the same retention, written in the same script as the claim), and no
-- step reads that mark once the claim says `answered`. The marks next to the topic are read only
-- where a five-step finish may have written one that the claim does not show yet: the claim is
-- `claimed` (a finish stopped between publish and settle), the claim notes a refusal (format 2:
-- claim.lua notes it before a refusal is published, settle.lua after), or the ledger is not
-- trusted to carry those notes (format 1, or 2 rolling from 1).
-- In format 3 the common answer takes a claim that is not there with one `SET NX GET` of the
-- whole claim string, `answered` with its answer, before publishing (as one server's
-- answer_batch.lua takes its mark), and deletes it again if the answer cannot be published; a
-- claim already there comes back from the same command (a hash, left by format 2, as WRONGTYPE,
-- then read with HMGET) and is decided and written as before, in its own shape.
-- Ledger keys are read and written with `redis.call`, but for the claim's first read, under
-- `redis.pcall` for WRONGTYPE only (a claim of the other shape, read again as such): a key of a
-- third type (written by something other than toolhost) fails that second read and the whole
-- call, and the bus then runs each item on its own, so it fails alone; an item already written
-- by the failed call finds its claim `answered` with its own answer id, and is acked as
-- published. The answer's XADD to a caller-named topic stays under `redis.pcall`.
local trusted = ARGV[4] ~= '0'
local strings = ARGV[4] == '3'
local n = (#ARGV - 4) / 5
local replies = {}
local acked = {}
local k = 1
for i = 1, n do
  local a = 4 + (i - 1) * 5
  local claim_key, refusal_copy, topic = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  local final_mark, refusal_mark = KEYS[k + 4], KEYS[k + 5]
  local record_key = nil
  if ARGV[a + 4] == '1' then
    record_key = KEYS[k + 6]
    k = k + 6
  else
    k = k + 5
  end
  local entry, id, kept = ARGV[a + 1], ARGV[a + 2], ARGV[a + 5]
  local keep = kept ~= ''
  local reply
  local claim = 0
  -- The claim as it was (nil when format 3 just took it) and its shape (true a string).
  local held, shape
  if strings then
    local before = redis.pcall('SET', claim_key, claim_value(topic, 'answered', id, entry, keep and kept, false),
      'NX', 'GET', 'PX', ARGV[3])
    if type(before) == 'table' then
      held, shape = redis.call('HMGET', claim_key, 'topic', 'state', 'answer', 'entry', 'kept', 'refused'), false
    elseif before then
      held, shape = parse_claim(before), true
    else
      -- The common answer: no claim was there, so none of the request's entries was answered
      -- or refused (format 2 and 3 note every refusal in the claim), and this one is taken.
      reply = add_answer(topic, ARGV[2], id, ARGV[a + 3], true)
      if reply == nil then
        reply = 1
      else
        -- Nothing of this item may stay written.
        redis.call('DEL', claim_key)
      end
    end
  else
    -- read_claim's hash-first read, inlined: the common answer of format 2 pays one HMGET.
    held = redis.pcall('HMGET', claim_key, 'topic', 'state', 'answer', 'entry', 'kept', 'refused')
    if held.err then
      held, shape = parse_claim(redis.call('GET', claim_key)), true
    end
  end
  if held then
    local refused = false
    if not trusted or held[6] then
      refused = redis.call('GET', refusal_copy)
    end
    if held[2] == 'answered' and not refused and keep and held[5] and held[4] and held[4] ~= entry
        and held[3] ~= id then
      reply = {2, (held[3] or '') .. '\n' .. held[4] .. '\n' .. held[5]}
    elseif held[2] == 'answered' or refused then
      claim = 1
      reply = (held[3] == id or refused == id) and 1 or 0
    elseif held[1] and held[1] ~= topic then
      -- A copy of the request named another topic, and that one gets the answer.
      claim = 2
      reply = 0
    else
      local final_on_topic = true
      local answered_here, refused_here = false, false
      if not trusted or held[1] or held[6] then
        local marks = redis.call('MGET', final_mark, refusal_mark)
        answered_here, refused_here = marks[1], marks[2]
      end
      if answered_here then
        reply = answered_here == id and 1 or 0
      elseif refused_here then
        -- This entry's refusal is on the topic: its one answer.
        reply = refused_here == id and 1 or 0
        final_on_topic = false
      else
        reply = add_answer(topic, ARGV[2], id, ARGV[a + 3], true) or 1
      end
      if final_on_topic and (reply == 0 or reply == 1) then
        -- A claim keeps its shape; a new one (shape nil) is a string only when format 3 took it
        -- above, which never reaches here.
        if shape then
          -- The whole claim in one SET, its note of a refusal kept.
          if reply == 0 then
            redis.call('SET', claim_key, claim_value(topic, 'answered', held[3], held[4], held[5], held[6]),
              'PX', ARGV[3])
          else
            redis.call('SET', claim_key, claim_value(topic, 'answered', id, entry, keep and kept, held[6]),
              'PX', ARGV[3])
          end
        else
          -- One HSET of every field this answer records, spelt out (no table to build and unpack).
          if reply == 0 then
            redis.call('HSET', claim_key, 'topic', topic, 'state', 'answered')
          elseif keep then
            redis.call('HSET', claim_key, 'topic', topic, 'state', 'answered', 'answer', id, 'entry', entry,
              'kept', kept)
          else
            redis.call('HSET', claim_key, 'topic', topic, 'state', 'answered', 'answer', id, 'entry', entry)
          end
          redis.call('PEXPIRE', claim_key, ARGV[3])
        end
      end
    end
  end
  if reply == 0 or reply == 1 then
    if claim ~= 2 and record_key then
      redis.call('DEL', record_key)
    end
    acked[#acked + 1] = entry
  end
  replies[i] = reply
end
if #acked > 0 then
  -- A missing group (Redis lost its data) fails the ack; what was published still stands.
  redis.pcall('XACK', KEYS[1], ARGV[1], unpack(acked))
end
return replies
