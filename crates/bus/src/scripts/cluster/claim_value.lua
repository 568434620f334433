-- The request's claim in either of its two shapes, prepended to every cluster script that reads
-- or writes one (answer_local.lua, claim.lua, settle.lua, begin_call.lua).
-- Ledger formats 1 and 2 keep a claim as a hash (fields topic, state, answer, entry, kept,
-- refused); format 3 keeps it as one string (docs/CONTRACTS.md, "The ledger's format"):
--   <state><refused><topic length>:<topic>[<answer id>\n<entry id>[\n<kept>]]
-- state one character, `a` answered, `c` claimed, `-` neither (a claim holding only the note of a
-- refusal); refused `r` when an entry of the request was refused (format 2's field `refused`),
-- else `-`; the topic's length in bytes, in decimal (0 with no topic); then, when the claim
-- holds an answer, its id and entry and, last, what is kept of it for retries, which may hold
-- anything. Answer ids and entry ids hold no newline.
-- A claim keeps the shape it was created in until it expires: every script reads both, and
-- writes a claim already there in its own shape; only a new claim takes the writer's format.

-- The fields of a claim string, as HMGET of topic, state, answer, entry, kept, refused returns
-- them from a hash (a field not there is false).
local function parse_claim(value)
  local colon = string.find(value, ':', 3, true)
  local topic_end = colon + tonumber(string.sub(value, 3, colon - 1))
  local held = {false, false, false, false, false, false}
  local state = string.byte(value, 1)
  if state == 97 then
    held[2] = 'answered'
  elseif state == 99 then
    held[2] = 'claimed'
  end
  if topic_end > colon then
    held[1] = string.sub(value, colon + 1, topic_end)
  end
  if string.byte(value, 2) == 114 then
    held[6] = '1'
  end
  if topic_end < #value then
    local at = string.find(value, '\n', topic_end + 1, true)
    if not at then
      held[3] = string.sub(value, topic_end + 1)
    else
      held[3] = string.sub(value, topic_end + 1, at - 1)
      local kept_at = string.find(value, '\n', at + 1, true)
      if kept_at then
        held[4] = string.sub(value, at + 1, kept_at - 1)
        held[5] = string.sub(value, kept_at + 1)
      else
        held[4] = string.sub(value, at + 1)
      end
    end
  end
  return held
end

-- A claim string from its fields (each false or nil when not there; `state` 'answered',
-- 'claimed' or nothing).
local function claim_value(topic, state, answer, entry, kept, refused)
  local value = (state == 'answered' and 'a' or (state == 'claimed' and 'c' or '-'))
    .. (refused and 'r' or '-') .. #(topic or '') .. ':' .. (topic or '')
  if answer then
    value = value .. answer
    if entry then
      value = value .. '\n' .. entry
      if kept then
        value = value .. '\n' .. kept
      end
    end
  end
  return value
end

-- Reads the claim at `key`: its fields (as parse_claim) and its shape, true for a string, false
-- for a hash, nil when there is none. The shape the writer's format writes is tried first, so a
-- claim of that shape costs one command; the other shape answers WRONGTYPE (nothing else can
-- fail a read of a key), and the second read is of the other shape. A key of a third type
-- (written by something other than toolhost) fails that second read, as it failed the one read
-- before format 3.
local function read_claim(key, strings_first)
  if strings_first then
    local value = redis.pcall('GET', key)
    if type(value) == 'table' then
      return redis.call('HMGET', key, 'topic', 'state', 'answer', 'entry', 'kept', 'refused'), false
    end
    if not value then
      return {false, false, false, false, false, false}, nil
    end
    return parse_claim(value), true
  end
  local held = redis.pcall('HMGET', key, 'topic', 'state', 'answer', 'entry', 'kept', 'refused')
  if held.err then
    return parse_claim(redis.call('GET', key)), true
  end
  if not (held[1] or held[2] or held[3] or held[4] or held[5] or held[6]) then
    return held, nil
  end
  return held, false
end
