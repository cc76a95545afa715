-- KEYS: the key's slots, its usage hash, the set of keys with usage, then per scope: tokens
--       hash, budget counter (or ''), soft-limit flag, money budget counter (or '').
-- ARGV: slot token ('': none), bucket, delta, scopes, usage (1: count it), the usage's eight
--       increments (USAGE_FIELDS), the money's correction (nano-dollars, signed), the key's
--       name, the number of targets its spend is counted under, each target's name and
--       nano-dollars; then per scope: soft-limit tokens (0: none), budget's ttl.
-- Corrects an estimate where it is still counted (never below 0), frees the slot and counts the
-- usage. Returns per scope {soft limit reached (1), spent}. Every argument is checked (whole
-- numbers of at most 15 digits, the corrections signed) before the first write: an error
-- writes nothing.
for _, i in ipairs({3, 14}) do
  if not string.match(ARGV[i], '^%-?%d+$') or #ARGV[i] > 17 then
    return redis.error_reply('llmroute limits: a correction is not a whole number of 16 digits')
  end
end
for i = 6, 13 do
  if not string.match(ARGV[i], '^%d+$') or #ARGV[i] > 16 then
    return redis.error_reply('llmroute limits: a usage count is not a whole number of 16 digits')
  end
end
if not string.match(ARGV[2], '^%d+$') or not string.match(ARGV[4], '^%d+$') then
  return redis.error_reply('llmroute limits: the bucket or the scopes are not whole numbers')
end
if not string.match(ARGV[16], '^%d+$') or #ARGV[16] > 4 then
  return redis.error_reply('llmroute limits: the number of targets is not a small count')
end
local targets = tonumber(ARGV[16])
local first = 17 + 2 * targets  -- the first scope's arguments
if #ARGV ~= first - 1 + 2 * tonumber(ARGV[4]) or #KEYS ~= 3 + 4 * tonumber(ARGV[4]) then
  return redis.error_reply('llmroute limits: arguments do not match the scopes and targets')
end
for i = 17, #ARGV do
  if (i >= first or i % 2 == 0) and (not string.match(ARGV[i], '^%d+$') or #ARGV[i] > 16) then
    return redis.error_reply('llmroute limits: argument ' .. i .. ' is not a whole number')
  end
end
if ARGV[1] ~= '' then redis.call('ZREM', KEYS[1], ARGV[1]) end
if ARGV[5] == '1' then
  local names = {'requests', 'errors', 'prompt_tokens', 'completion_tokens', 'cache_hits',
                 'spend_nanos', 'hedge_nanos', 'estimated_nanos'}
  for i = 1, 8 do
    if ARGV[5 + i] ~= '0' then redis.call('HINCRBY', KEYS[2], names[i], ARGV[5 + i]) end
  end
  for i = 17, first - 1, 2 do
    if ARGV[i + 1] ~= '0' then
      redis.call('HINCRBY', KEYS[2], 'spend_nanos@' .. ARGV[i], ARGV[i + 1])
    end
  end
  redis.call('SADD', KEYS[3], ARGV[15])
end
local delta, change = tonumber(ARGV[3]), tonumber(ARGV[14])
local out = {}
for i = 0, tonumber(ARGV[4]) - 1 do
  local k, a = 4 + 4 * i, first + 2 * i
  local reached, spent = 0, -1
  if delta ~= 0 then
    if redis.call('HEXISTS', KEYS[k], ARGV[2]) == 1 then
      local c = redis.call('HINCRBY', KEYS[k], ARGV[2], ARGV[3])
      if c < 0 then redis.call('HSET', KEYS[k], ARGV[2], 0) end
    end
    if KEYS[k + 1] ~= '' and redis.call('EXISTS', KEYS[k + 1]) == 1 then
      spent = redis.call('INCRBY', KEYS[k + 1], ARGV[3])
      if spent < 0 then
        redis.call('SET', KEYS[k + 1], 0, 'KEEPTTL')
        spent = 0
      end
      local soft, ttl = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
      if soft > 0 and spent >= soft and redis.call('SET', KEYS[k + 2], 1, 'EX', ttl, 'NX') then
        reached = 1
      end
    end
  end
  if change ~= 0 and KEYS[k + 3] ~= '' and redis.call('EXISTS', KEYS[k + 3]) == 1 then
    if redis.call('INCRBY', KEYS[k + 3], ARGV[14]) < 0 then
      redis.call('SET', KEYS[k + 3], 0, 'KEEPTTL')
    end
  end
  out[#out + 1] = reached
  out[#out + 1] = spent
end
return out
